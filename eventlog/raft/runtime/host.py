"""A node hosting several Raft groups (multi-raft) over one peer transport.

Each group (`metadata`, `offsets`, `kv`, ...) has its own directory `<data_dir>/groups/<name>/`,
its own log, leader and state machine, and its own task; all share the node's connections.
`<data_dir>/cluster-id` records the cluster name: a node refuses a data directory of another cluster.
One scrub thread checks the sealed segments of every group's log (`[log] scrub_bytes_per_second`,
eventlog/scrub.py).

The configured members are every group's initial voters, on every node. A node added at runtime
(not in the list: `member` gives its addresses) starts from that same initial configuration, which
does not include it, so it never campaigns and cannot form a cluster of its own: it waits for the
leaders to add it as a learner, and learns everything else (membership included) from their logs.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from eventlog.errors import ConfigError
from eventlog.raft.peer_check import UNKNOWN_GROUP, Drop, PeerCheck
from eventlog.raft.runtime.config import MemberConfig, NodeConfigs, parse_address
from eventlog.raft.runtime.entries import check_entry
from eventlog.raft.runtime.group import RaftGroup, StateMachine, initial_conf
from eventlog.raft.runtime.lag import LagMonitor
from eventlog.raft.runtime.leader_balance import LeaderBalance
from eventlog.raft.runtime.log_storage import LogStorage
from eventlog.raft.runtime.peer_drops import PeerDrops
from eventlog.raft.runtime.tls import PeerTls, load_peer_tls
from eventlog.raft.runtime.transport import MAX_FRAME_BYTES, PeerTransport, largest_frame_bytes
from eventlog.raft.types import Message
from eventlog.scrub import Scrubber

logger = logging.getLogger(__name__)

StateMachineFactory = Callable[[str, Path], StateMachine]


class NodeHost:
    """All groups of one node. Create and use on one asyncio loop."""

    def __init__(self, node_id: int, data_dir: str | Path, configs: NodeConfigs,
                 state_machine: StateMachineFactory, *, seed: int | None = None,
                 member: MemberConfig | None = None,
                 retention_floor: Callable[[str], int | None] | None = None,
                 space_guard: Callable[[], str | None] | None = None,
                 ships_log_prefix: Callable[[str], bool] | None = None,
                 features: dict[str, int] | None = None) -> None:
        self.node_id = node_id
        self.features = dict(features or {})   # advertised in this node's peer hello (transport.py)
        self._retention_floor = retention_floor   # group name -> RaftGroup.retention_floor
        self._ships_log_prefix = ships_log_prefix  # group name -> LogStorage.ships_log_prefix (default: no)
        self._space_guard = space_guard           # RaftGroup.space_guard of every group
        self.data_dir = Path(data_dir)
        self.configs = configs
        self._factory = state_machine
        self._rng = random.Random(seed)
        self.member = configs.cluster.member(node_id) if member is None else member
        if self.member.id != node_id:
            raise ConfigError("member.id", self.member.id, f"is not this node's id {node_id}")
        self.configured = any(m.id == node_id for m in configs.cluster.members)
        self.groups: dict[str, RaftGroup] = {}
        self.transport: PeerTransport | None = None
        self.peer_drops = PeerDrops(node_id)
        self.scrubber: Scrubber | None = None

    async def start(self) -> None:
        cluster = self.configs.cluster
        tls = self._peer_tls()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._check_cluster_id()
        peers = {m.id: parse_address(m.peer_address, f"cluster.members[{m.id}].peer_address")
                 for m in (*cluster.members, self.member)}
        self.transport = PeerTransport(self.node_id, cluster.name, peers, peers[self.node_id], self._deliver,
                                       tls=tls, limits=cluster.peer_limits,
                                       dial_lower_ms=0 if self.configured else 1000, features=self.features)
        conf = initial_conf([m.id for m in cluster.members])
        entry_check = functools.partial(check_entry, max_batch_bytes=self.configs.log.batch_limit_bytes)
        for rank, name in enumerate(cluster.groups):
            directory = self.data_dir / "groups" / name
            ships = self._ships_log_prefix is not None and self._ships_log_prefix(name)
            storage = LogStorage.open(directory, self.configs.log, conf, ships_log_prefix=ships)
            check = PeerCheck(known_peer=self._known_peer, check_entry=entry_check,
                              check_snapshot_chunk=storage.snapshot_chunk_refusal)
            sm = self._factory(name, directory)
            snap = storage.snapshot()
            if sm.applied_index < snap.index:
                # Killed after the log storage installed a snapshot (its log now starts after it) and
                # before the state machine restored it: restore now, or the next entry leaves a gap.
                sm.restore(storage.snapshot_dir(snap) / "data", snap)
            group = RaftGroup(name, self.node_id, storage, sm, self.configs.raft, self._send, flush=self._flush,
                              tick_interval_ms=cluster.tick_interval_ms,
                              rng=random.Random(self._rng.getrandbits(64)),
                              snapshot_every_entries=cluster.snapshot_every_entries,
                              snapshot_every_bytes=cluster.snapshot_every_bytes,
                              max_batch_bytes=self.configs.log.batch_limit_bytes - 4096,
                              lag=LagMonitor(warn_after_s=cluster.lag_warning_ms / 1000,
                                             min_offsets=cluster.lag_warning_offsets,
                                             repeat_s=cluster.lag_warning_repeat_ms / 1000),
                              peer_check=check, peer_drops=self.peer_drops,
                              balance=LeaderBalance(rank, settle_s=cluster.leader_balance_settle_ms / 1000,
                                                    preferred=cluster.preferred_leader(name))
                              if cluster.leader_balance else None)
            if self._retention_floor is not None:   # set before the group can snapshot
                group.retention_floor = functools.partial(self._retention_floor, name)
            group.space_guard = self._space_guard
            group.peer_reads_index = self.transport.reads_index
            self.groups[name] = group
        firsts = {name: g.balance.order(g.node.conf.voters)[0] for name, g in self.groups.items()
                  if g.balance is not None and g.node.conf.voters}
        if firsts:
            logger.info("leader balance: each group's leader hands leadership to its first choice once settled: %s",
                        ", ".join(f"{name} -> node {node}" for name, node in firsts.items()))
        for group in self.groups.values():
            group.start()
        if self.configs.log.scrub_bytes_per_second:
            logs = {name: group.storage.log for name, group in self.groups.items()}
            self.scrubber = Scrubber(lambda: logs, self.configs.log.scrub_bytes_per_second,
                                     name=f"log-scrub-{self.node_id}")
            self.scrubber.start()
        await self.transport.start()

    def _peer_tls(self) -> PeerTls | None:
        """The peer TLS contexts (ConfigError when a file is missing or wrong), after checking that the
        peer port's partial-frame budget holds the largest frame a member sends."""
        cluster = self.configs.cluster
        largest = largest_frame_bytes(self.configs.raft, self.configs.log)
        if largest > MAX_FRAME_BYTES:
            raise ConfigError("raft.max_append_bytes", self.configs.raft.max_append_bytes,
                              f"with [log] and snapshot_chunk_bytes a peer frame may be {largest} bytes, above "
                              f"the limit of {MAX_FRAME_BYTES}")
        if cluster.peer_limits.partial_frames_bytes < largest:
            raise ConfigError("cluster.peer_limits.partial_frames_bytes", cluster.peer_limits.partial_frames_bytes,
                              f"must hold the largest frame a member sends with these [raft] and [log] settings "
                              f"({largest} bytes)")
        tls = load_peer_tls(cluster.tls, self.data_dir, cluster.name, self.node_id)
        if tls is None:
            logger.warning("node %s: peer TLS is OFF ([cluster.tls] insecure = true): peers are not "
                           "authenticated, anyone who can reach %s can act as a member; for development only",
                           self.node_id, self.member.peer_address)
        return tls

    def _check_cluster_id(self) -> None:
        marker = self.data_dir / "cluster-id"
        name = self.configs.cluster.name
        if marker.exists():
            found = marker.read_text().strip()
            if found != name:
                raise ConfigError("cluster.name", name, f"{self.data_dir} belongs to cluster {found!r}")
        else:
            marker.write_text(name + "\n")

    def _deliver(self, src: int, group: str, msg: Message) -> None:
        """A message from peer `src` (as the transport authenticated it): to its group, which checks it."""
        g = self.groups.get(group)
        if g is not None:
            g.deliver(src, msg)
        else:
            self.peer_drops.dropped(group, src, Drop(UNKNOWN_GROUP, "this node runs no such group"), msg)

    def _known_peer(self, peer: int) -> bool:
        """In this node's address book: a member of the cluster, not a removed one (PeerCheck.known_peer)."""
        return self.transport is not None and peer in self.transport.peers

    def _send(self, dst: int, group: str, msg: Message) -> None:
        assert self.transport is not None
        self.transport.send(dst, group, msg)

    def _flush(self) -> None:
        assert self.transport is not None
        self.transport.flush()

    def leader_of(self, group: str) -> int:
        return self.groups[group].node.leader

    def feature_levels(self, group: str, feature: str) -> list[int | None]:
        """What each member of `group`'s configuration (the latest one and the committed one: voters and
        learners, this node included) advertises for `feature` in its peer hello: the level (0: its hello
        has none, an older version), or None when it is not connected now (not known)."""
        n = self.groups[group].node
        conf, committed = n.conf, n.conf_at(n.log.committed)
        members = {*conf.voters, *conf.learners, *committed.voters, *committed.learners}
        levels: list[int | None] = []
        for member in sorted(members):
            if member == self.node_id:
                levels.append(self.features.get(feature, 0))
                continue
            features = None if self.transport is None else self.transport.peer_features(member)
            levels.append(None if features is None else features.get(feature, 0))
        return levels

    async def stop(self, step: Callable[[str], AbstractContextManager[None]] = lambda _: nullcontext()) -> None:
        """The scrubber, the transport, then each group; `step(name)` wraps each (the node times them)."""
        with step("the scrubber"):
            if self.scrubber is not None:
                self.scrubber.close()
        with step("the peer transport"):
            if self.transport is not None:
                await self.transport.close()
        for name, group in self.groups.items():
            with step(f"group {name}"):
                await group.close()
