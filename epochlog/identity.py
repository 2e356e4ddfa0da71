"""Which member this process runs: a configured one, or a node that joins at runtime.

A configured member's addresses come from `[[cluster.members]]`. A node that is not in that list
(it joins an existing cluster: `epochlog serve --node-id 4 --peer-address H:P --client-address
H:P`, then a member add on the cluster) gives its addresses on the command line; they are
remembered in `<data_dir>/member.json`, so later starts need no flags (flags given again replace
them). Such a node starts with the configured initial voters, which do not include it, so it never
campaigns and cannot start a cluster of its own (see eventlog.raft.runtime.host).

Every data directory also has an id of its own (`storage_id`: random, made once, like Kafka's
`directory.id`), which a node reports in its status: `epochlog up` knows the id of each directory it
runs a node on, so it can tell its own nodes (restarted by hand too) from another cluster's.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import msgspec

from eventlog.errors import ConfigError
from eventlog.fileutil import atomic_write
from eventlog.raft.runtime.config import MemberConfig, NodeConfigs

MEMBER_FILE = "member.json"
STORAGE_ID_FILE = "storage.id"


def storage_id(data_dir: str | Path) -> str:
    """The id of the data directory `data_dir`: read, or made (and the directory created) when missing."""
    path = Path(data_dir) / STORAGE_ID_FILE
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        text = ""
    if text:
        return text
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    made = secrets.token_hex(16)
    atomic_write(path, (made + "\n").encode())
    return made


class _Saved(msgspec.Struct):
    id: int
    peer_address: str
    client_address: str = ""
    admin_address: str = ""


def resolve_member(configs: NodeConfigs, node_id: int, data_dir: str | Path, *, peer_address: str = "",
                   client_address: str = "", admin_address: str = "") -> MemberConfig:
    """This node's member entry (see the module docstring); ConfigError when it cannot be known."""
    given = peer_address or client_address or admin_address
    for m in configs.cluster.members:
        if m.id == node_id:
            if given:
                raise ConfigError("--peer-address", peer_address or client_address or admin_address,
                                  f"node {node_id} is a configured member: its addresses come from the config")
            return m
    path = Path(data_dir) / MEMBER_FILE
    if given:
        member = MemberConfig(id=node_id, peer_address=peer_address, client_address=client_address,
                              admin_address=admin_address)
        member.validate(f"node {node_id}")
        taken = {a for m in configs.cluster.members for a in (m.peer_address, m.client_address, m.admin_address)}
        clash = [a for a in (peer_address, client_address, admin_address) if a and a in taken]
        if clash:
            raise ConfigError("--peer-address", clash[0], "is the address of a configured member")
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        atomic_write(path, msgspec.json.encode(_Saved(node_id, peer_address, client_address, admin_address)))
        return member
    try:
        saved = msgspec.json.decode(path.read_bytes(), type=_Saved)
    except FileNotFoundError:
        raise ConfigError("--node-id", node_id, f"is not a configured member (members: "
                          f"{[m.id for m in configs.cluster.members]}); a node joining at runtime needs "
                          f"--peer-address (and --client-address)") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(str(path), "", f"unreadable: {exc}") from None
    if saved.id != node_id:
        raise ConfigError("--node-id", node_id, f"{Path(data_dir)} belongs to node {saved.id}")
    return MemberConfig(id=node_id, peer_address=saved.peer_address, client_address=saved.client_address,
                        admin_address=saved.admin_address)
