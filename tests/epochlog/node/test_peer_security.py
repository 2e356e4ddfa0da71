"""The peer port of real `epochlog serve` nodes against outsiders (issue 18): mutual TLS, identity, limits.

Issue 18 tried, on plaintext peers: a non-member repeating the cluster name, claiming node id 42 and
sending a Vote with term 10^12 bricked the cluster for good; three hello-less connections each
declaring a 256 MiB frame and sending 200 MiB held the node's RSS at +600 MiB; a truncated frame
stayed open forever. Here the same inputs go to a 3-node cluster on mutual TLS (the default): no
term moves, every node lives and serves, the node's memory stays within the partial-frame budget
plus a margin, and the timeouts close what stalls. Outsiders are asyncio connections of this process
(plaintext, TLS without a certificate, a certificate of another CA, a client certificate, a
certificate of the cluster's CA for a node id that is not a member); what they manage is read back
from /metrics (epochlog_peer_connections_closed_total{reason}) and the nodes' status.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
import time
from collections.abc import Callable
from pathlib import Path

from epochlog.certs import ClusterCA
from epochlog.client import Client
from eventlog.raft.runtime.transport import Batch, Hello, encode_frame
from eventlog.raft.types import Vote
from tests.support.nodes import NodeCluster
from tests.support.wait import wait_until

GROUPS = ("metadata", "offsets", "kv")
HUGE_TERM = 10**12
LIMITS = {"hello_timeout_ms": 2000, "frame_timeout_ms": 2000, "partial_frames_bytes": 32 << 20}
MIB = 1 << 20


def closes(cluster: NodeCluster, node: int) -> dict[str, float]:
    """epochlog_peer_connections_closed_total by reason on `node`."""
    return {dict(labels)["reason"]: value for (name, labels), value in cluster.wait_metrics(node).items()
            if name == "epochlog_peer_connections_closed_total"}


def terms(cluster: NodeCluster) -> dict[tuple[int, str], int]:
    out = {}
    for node in cluster.running():
        for group in GROUPS:
            out[(node, group)] = cluster.wait_group_status(node, group).term
    return out


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def context(cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if cert is not None:
        ctx.load_cert_chain(*map(str, cert))
    return ctx


async def connect(address: str, *, tls: bool,
                  cert: tuple[Path, Path] | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = address.rpartition(":")
    ctx = context(cert) if tls else None
    return await asyncio.open_connection(host, int(port), ssl=ctx, server_hostname="" if ctx else None)


async def until_closed(reader: asyncio.StreamReader, timeout: float) -> float:
    """Seconds until the node closes the connection (EOF, reset or TLS alert); AssertionError past `timeout`."""
    start = time.monotonic()
    while True:
        left = timeout - (time.monotonic() - start)
        assert left > 0, f"the node kept the connection open for {timeout} s"
        try:
            if not await asyncio.wait_for(reader.read(65536), left):
                return time.monotonic() - start
        except TimeoutError:
            continue
        except (ConnectionError, ssl.SSLError, OSError):
            return time.monotonic() - start


async def stream(writer: asyncio.StreamWriter, total: int) -> int:
    """Write up to `total` zero bytes in 1 MiB chunks until the node closes; the bytes written."""
    chunk = b"\0" * MIB
    sent = 0
    try:
        while sent < total:
            writer.write(chunk)
            await asyncio.wait_for(writer.drain(), 30)
            sent += len(chunk)
    except (ConnectionError, ssl.SSLError, OSError, TimeoutError):
        pass
    return sent


def member_files(cluster: NodeCluster, node_id: int, tmp: Path) -> tuple[Path, Path]:
    """A certificate of the cluster's own CA for `node_id` (a node that is not a member)."""
    files = ClusterCA.load(cluster.root / "ca").issue_member(node_id, tmp / f"outsider-{node_id}")
    return files.cert, files.key


def test_a_non_member_reaches_no_core_and_a_forged_hello_is_refused(
        node_cluster_factory: Callable[..., NodeCluster], tmp_path: Path) -> None:
    """The issue's one-message brick, over every door an outsider has: nothing reaches a group."""
    cluster = node_cluster_factory(name="peer-security", cluster={"peer_limits": LIMITS})
    cluster.start()
    for group in GROUPS:
        cluster.leader(group)
    before = terms(cluster)
    other_ca = ClusterCA.create(tmp_path / "other-ca", cluster.name).issue_member(1, tmp_path / "other-n1")
    client_cert = ClusterCA.load(cluster.root / "ca").issue_client("alice", tmp_path / "clients")
    outsider = member_files(cluster, 9, tmp_path)

    def brick(claim: int, dst: int) -> bytes:   # the issue's hello and vote
        return encode_frame(Hello(cluster.name, claim)) + encode_frame(Batch(
            [(g, Vote(term=HUGE_TERM, src=claim, dst=dst, last_index=10**9, last_term=HUGE_TERM)) for g in GROUPS]))

    async def attack() -> None:
        for node in cluster.nodes.values():
            address = node.peer_address
            doors: list[tuple[bool, tuple[Path, Path] | None, int]] = [
                (False, None, 42),                                   # plaintext, node id 42
                (True, None, 1),                                     # TLS, no certificate
                (True, (other_ca.cert, other_ca.key), 1),            # node 1 of the same name, another CA
                (True, (client_cert.cert, client_cert.key), 1),      # the cluster CA's client certificate
                (True, outsider, 1 if node.id != 1 else 2),          # a node 9 certificate claiming a member
            ]
            for tls, cert, claim in doors:
                reader, writer = await connect(address, tls=tls, cert=cert)
                writer.write(brick(claim, node.id))
                await until_closed(reader, 10)
                writer.close()
    asyncio.run(attack())

    for i in cluster.nodes:
        reasons = closes(cluster, i)
        assert reasons.get("tls_handshake", 0) >= 3 and reasons.get("identity", 0) >= 2, (i, reasons)
    assert cluster.running() == [1, 2, 3], cluster.describe()
    after = terms(cluster)
    assert max(after.values()) < 1000 and all(after[k] >= before[k] for k in before), (before, after)
    with Client(cluster.endpoints, timeout=20.0) as client:
        written = client.put("after/attack", b"ok")
        assert client.get("after/attack").value == b"ok" and written.offset >= 0  # type: ignore[union-attr]
    assert set(cluster.stop_all().values()) == {0}


def test_huge_partial_frames_hold_bounded_memory_and_stalled_connections_are_closed(
        node_cluster_factory: Callable[..., NodeCluster], tmp_path: Path) -> None:
    """The issue's memory case, then past TLS and the hello: three connections holding member
    certificates declare 256 MiB frames and send up to 200 MiB each; the node keeps at most
    partial_frames_bytes (32 MiB here) of them and gives it back. A truncated frame and a silent
    connection are closed by the frame and hello timeouts (2 s here)."""
    cluster = node_cluster_factory(name="peer-memory", cluster={"peer_limits": LIMITS})
    cluster.start()
    for group in GROUPS:
        cluster.leader(group)
    node = cluster.nodes[3]
    assert node.pid is not None
    outsiders = [member_files(cluster, i, tmp_path) for i in (7, 8, 9)]
    time.sleep(1.0)
    before = rss_bytes(node.pid)

    async def flood() -> tuple[list[int], list[int]]:
        # The issue's exact input: hello-less plaintext connections declaring 256 MiB (the TLS
        # handshake fails on their first bytes).
        plain = [await connect(node.peer_address, tls=False) for _ in range(3)]
        for _, w in plain:
            w.write(struct.pack(">I", 256 * MIB))
        plain_sent = await asyncio.gather(*(stream(w, 200 * MIB) for _, w in plain))
        # Authenticated: a member certificate and its honest hello, then the huge frame.
        members = [await connect(node.peer_address, tls=True, cert=cert) for cert in outsiders]
        for (_, w), node_id in zip(members, (7, 8, 9)):
            w.write(encode_frame(Hello(cluster.name, node_id)) + struct.pack(">I", 256 * MIB))
        member_sent = await asyncio.gather(*(stream(w, 200 * MIB) for _, w in members))
        for r, w in (*plain, *members):
            await until_closed(r, 30)
            w.close()
        return list(plain_sent), list(member_sent)

    plain_sent, member_sent = asyncio.run(flood())
    print(f"bytes written before the node closed: plaintext {plain_sent}, members {member_sent}")
    assert all(s < 200 * MIB for s in plain_sent + member_sent), "a connection took 200 MiB"
    wait_until(lambda: closes(cluster, 3).get("partial_frames", 0) + closes(cluster, 3).get("frame_timeout", 0) >= 3,
               30, "the three member connections closed for partial_frames or frame_timeout")
    assert closes(cluster, 3).get("tls_handshake", 0) >= 3
    after = rss_bytes(node.pid)
    print(f"node 3 RSS: {before / MIB:.0f} MiB before, {after / MIB:.0f} MiB after")
    assert after - before < 32 * MIB + 64 * MIB, (before, after)   # the budget plus allocator slack

    async def stall() -> tuple[float, float]:
        reader, writer = await connect(node.peer_address, tls=True, cert=outsiders[0])
        frame = encode_frame(Batch([("kv", Vote(term=1, src=7, dst=3, last_index=0, last_term=0))]))
        writer.write(encode_frame(Hello(cluster.name, 7)) + frame[:-2])   # a truncated frame
        silent_r, _silent_w = await connect(node.peer_address, tls=False)  # no TLS, no hello, nothing
        truncated, silent = await asyncio.gather(until_closed(reader, 30), until_closed(silent_r, 30))
        return truncated, silent

    truncated_s, silent_s = asyncio.run(stall())
    assert 1.5 <= truncated_s and 1.5 <= silent_s, (truncated_s, silent_s)
    reasons = closes(cluster, 3)
    assert reasons.get("frame_timeout", 0) >= 1 and reasons.get("hello_timeout", 0) >= 1, reasons
    assert cluster.running() == [1, 2, 3], cluster.describe()
    with Client(cluster.endpoints, timeout=20.0) as client:
        client.put("after/flood", b"ok")
    assert set(cluster.stop_all().values()) == {0}
