"""Issue 18, peer messages: hand-built Raft messages from outside, against real `epochlog serve` processes.

A process that is not a member connects to the peer ports, repeats the cluster name and claims node
id 42 (tests/epochlog/node/raw_peer.py), then sends what used to stop, fork or corrupt the cluster:

- a Vote with term 10^12: the kv leader granted it, was re-elected in term 10^12 + 1, and every node
  exited on the int32 epoch of the next record batch, again on every restart;
- a Heartbeat for another node (AssertionError: the node stopped);
- an InstallSnapshot whose last chunk ends before its size (RaftError: the node stopped);
- an Append from id 42: to one follower its entry was applied there and that replica differed for
  good; to every node in a newer term it was committed cluster-wide.

Each is dropped before Raft sees it and counted (`epochlog_peer_messages_dropped_total{reason}`): no
node exits, the kv group keeps its leader and term, no forged record is in any node's log, and the
cluster keeps taking writes; at the end every node stops with the same views digest.

Once NodeCluster speaks mutual TLS (the peer-security branch), the outsider connects with a
certificate the cluster's CA issued to node 42 (`outsider_tls`): authenticated, not a member, and
stopped by the checks all the same. The same Append claiming a member's id is stopped only by mutual
TLS: `test_a_forged_append_claiming_a_members_id_is_stopped_by_mutual_tls` asserts so there, and on
plain connections asserts that the forged record lands, then reports an xfail.
"""

from __future__ import annotations

import json
import ssl
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from epochlog.api import messages as p
from epochlog.client import Client
from eventlog.raft.peer_check import NOT_MEMBER, SNAPSHOT_CHUNK, TERM_LIMIT, UNKNOWN_GROUP, WRONG_DST
from eventlog.raft.types import Append, ConfState, Entry, Heartbeat, InstallSnapshot, SnapshotMeta, Vote
from eventlog.records import encode_batch
from tests.support.nodes import NodeCluster
from tests.support.wait import wait_until
from tests.support.fixtures import seed_for
from tests.epochlog.node.raw_peer import RawPeer

STRANGER = 42
GROUP = "kv"
DROPPED = "epochlog_peer_messages_dropped_total"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    """Three nodes with a 1-2 s election timeout (a leader change under a loaded machine stays unlikely,
    so one seen here is the attack's). At the end: every node still runs and, stopped, holds the same
    views digest of every group."""
    c = NodeCluster(tmp_path_factory.mktemp("peer"), seed=seed_for(request.module.__name__),
                    raft={"election_timeout_ticks": 20})
    try:
        c.start()
        yield c
        assert c.running() == list(c.nodes), c.describe()
        views = c.stop_converged(c.groups)
        for group, by_node in views.items():
            assert len(set(by_node.values())) == 1, f"{group}: {by_node}"
    finally:
        c.close()
        print(c.describe())


def dropped(c: NodeCluster, node: int, reason: str) -> float:
    return c.wait_metrics(node).get((DROPPED, (("reason", reason),)), 0.0)


class Attack:
    """The kv group before an attack, and what must hold after it."""

    def __init__(self, c: NodeCluster) -> None:
        self.c = c
        self.leader = c.leader(GROUP)
        self.followers = [n for n in c.nodes if n != self.leader]
        self.put(f"before-{uuid.uuid4().hex}")   # an entry of the current term at every node's log end
        self.status = {n: self._kv(n) for n in c.nodes}
        self.term = self.status[self.leader].term
        assert all(s.term == self.term and s.leader == self.leader for s in self.status.values()), self.status

    def _kv(self, node: int) -> p.GroupInfo:
        return self.c.wait_group_status(node, GROUP)

    def put(self, key: str) -> int:
        with Client(self.c.endpoints, timeout=10.0) as client:
            offset = client.put(key, b"v").offset
        for n in self.c.nodes:
            self.c.wait_applied(n, GROUP, offset)
        return offset

    def counts(self, reason: str) -> dict[int, float]:
        return {n: dropped(self.c, n, reason) for n in self.c.nodes}

    def wait_dropped(self, reason: str, before: dict[int, float], nodes: list[int]) -> None:
        """Until each of `nodes` counted one more drop for `reason` (its group stepped past the message)."""
        wait_until(lambda: all(dropped(self.c, n, reason) > before[n] for n in nodes), 15.0,
                   f"{reason} drops on nodes {nodes}")

    def check_unmoved(self) -> None:
        """No node exited, the kv group kept its leader and term everywhere, and it takes writes."""
        time.sleep(1.0)   # let anything the message could have set off show
        assert self.c.running() == list(self.c.nodes), self.c.describe()
        for n in self.c.nodes:
            info = self._kv(n)
            assert (info.term, info.leader) == (self.term, self.leader), f"node {n}: {info}"
        self.put(f"after-{uuid.uuid4().hex}")

    def forged_entry(self, key: str, node: int, term: int) -> Append:
        """An append of one record `key` right after `node`'s last entry, as its leader would send it."""
        last = self.status[node].last_offset
        batch = encode_batch([(key.encode(), b"forged")], timestamp_ms=int(time.time() * 1000))
        return Append(term=term, src=STRANGER, dst=node, prev_index=last, prev_term=self.term,
                      entries=(Entry(index=last + 1, term=term, data=batch),), commit=last + 1)

    def assert_nowhere(self, key: str) -> None:
        """No node holds a record `key` in its kv log (read_events from each, from before the attack)."""
        with Client(self.c.endpoints, timeout=10.0) as client:
            for n in self.c.nodes:
                start = min(s.last_offset for s in self.status.values())
                events = client.read_events(GROUP, start, endpoint=self.c.endpoint(n)).events
                assert events, f"node {n} serves nothing from {start}"
                assert all(e.key != key for e in events), f"node {n} holds the forged record at " \
                    f"{[e.offset for e in events if e.key == key]}"


def outsider_tls(c: NodeCluster, node_id: int = STRANGER) -> ssl.SSLContext | None:
    """With mutual TLS between members (branch peer-security: NodeCluster then gives the cluster a CA),
    a client context holding a certificate the cluster's own CA issued to `node_id`, a node that is not
    a member: the transport authenticates it, and only the checks here stop what it sends (a removed
    node's certificate is still valid). Without (this branch, or an `insecure` cluster): None, plain
    connections, on which id 42 is just claimed."""
    if getattr(c, "insecure", True) or not (c.root / "ca").exists():
        return None
    from epochlog.certs import ClusterCA  # type: ignore[import-not-found,unused-ignore]
    files = ClusterCA.load(c.root / "ca").issue_member(node_id, c.root / f"outsider-{node_id}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(files.cert), str(files.key))
    return ctx


def peer(c: NodeCluster, node: int, node_id: int = STRANGER) -> RawPeer:
    return RawPeer(c.nodes[node].peer_address, c.name, node_id, tls=outsider_tls(c, node_id))


def test_a_vote_with_a_term_beyond_the_limit_is_dropped(cluster: NodeCluster) -> None:
    """Issue 18's one message that bricked the cluster for good, to every node, and an in-range vote
    marked as a leadership transfer (it bypasses leader leases): neither moves the leader."""
    a = Attack(cluster)
    limit, member = a.counts(TERM_LIMIT), a.counts(NOT_MEMBER)
    for n in cluster.nodes:
        raw = peer(cluster, n)
        raw.send(GROUP, Vote(term=10**12, src=STRANGER, dst=n, last_index=10**12, last_term=10**12 - 1,
                             transfer=True))
        raw.send(GROUP, Vote(term=a.term + 1, src=STRANGER, dst=n, last_index=10**9, last_term=a.term,
                             transfer=True))
        assert raw.received(0.3) == [], "a granted or refused vote went back to the stranger"
        raw.close()
    a.wait_dropped(TERM_LIMIT, limit, list(cluster.nodes))
    a.wait_dropped(NOT_MEMBER, member, list(cluster.nodes))
    a.check_unmoved()


def test_a_heartbeat_for_another_node_is_dropped(cluster: NodeCluster) -> None:
    a = Attack(cluster)
    wrong, unknown = a.counts(WRONG_DST), a.counts(UNKNOWN_GROUP)
    for n in cluster.nodes:
        raw = peer(cluster, n)
        raw.send(GROUP, Heartbeat(term=a.term, src=STRANGER, dst=n + 100, commit=10**6))
        raw.send("no-such-group", Heartbeat(term=a.term, src=STRANGER, dst=n, commit=10**6))
        raw.close()
    a.wait_dropped(WRONG_DST, wrong, list(cluster.nodes))
    a.wait_dropped(UNKNOWN_GROUP, unknown, list(cluster.nodes))
    a.check_unmoved()


def test_an_inconsistent_snapshot_chunk_is_dropped(cluster: NodeCluster) -> None:
    """The last chunk of a snapshot ends at byte 5 of 10, in the leader's term and in a newer one."""
    a = Attack(cluster)
    before = a.counts(SNAPSHOT_CHUNK)
    meta = SnapshotMeta(index=10**6, term=a.term, conf=ConfState(voters=tuple(cluster.nodes)), size=10)
    for n in cluster.nodes:
        raw = peer(cluster, n)
        for term in (a.term, a.term + 1):
            raw.send(GROUP, InstallSnapshot(term=term, src=STRANGER, dst=n, meta=meta, offset=0, data=b"x" * 5,
                                            done=True))
        raw.close()
    a.wait_dropped(SNAPSHOT_CHUNK, before, list(cluster.nodes))
    a.check_unmoved()


def test_a_forged_append_from_a_non_member_is_dropped(cluster: NodeCluster) -> None:
    """Id 42 appends a record after each follower's last entry in the leader's term (it was applied
    there), then to every node in a newer term (it was committed cluster-wide)."""
    a = Attack(cluster)
    before = a.counts(NOT_MEMBER)
    key = f"kv/forged-{uuid.uuid4().hex}"
    for n in a.followers:
        raw = peer(cluster, n)
        raw.send(GROUP, a.forged_entry(key, n, a.term))
        raw.close()
    a.wait_dropped(NOT_MEMBER, before, a.followers)
    for n in cluster.nodes:
        raw = peer(cluster, n)
        raw.send(GROUP, a.forged_entry(key, n, a.term + 1))
        raw.close()
    a.wait_dropped(NOT_MEMBER, {n: before[n] + (n in a.followers) for n in cluster.nodes}, list(cluster.nodes))
    a.check_unmoved()
    a.assert_nowhere(key)


def test_a_forged_append_claiming_a_members_id_is_stopped_by_mutual_tls(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    """The kv leader's id, claimed on a new connection to a follower, with an append right after the
    follower's last entry in the leader's term: the peer checks cannot tell it from the leader's own
    (same id, term and log position). With mutual TLS between members (peer-security) the outsider's
    certificate names node 42, the node refuses the hello claiming the leader, and nothing is appended
    anywhere. On plain connections (this branch, or an insecure cluster) the forged record lands on the
    follower, whose views then differ for good: asserted, then reported as xfail, so the gap stays
    visible. (A cluster of its own, which this may break.)"""
    cluster = node_cluster_factory(raft={"election_timeout_ticks": 20})
    cluster.start()
    a = Attack(cluster)
    key = f"kv/forged-{uuid.uuid4().hex}"
    follower = a.followers[0]
    forged = a.forged_entry(key, follower, a.term)
    forged = Append(term=forged.term, src=a.leader, dst=forged.dst, prev_index=forged.prev_index,
                    prev_term=forged.prev_term, entries=forged.entries, commit=forged.commit)
    tls = outsider_tls(cluster)   # with mutual TLS: a valid certificate, of node 42
    raw = RawPeer(cluster.nodes[follower].peer_address, cluster.name, a.leader, first=(GROUP, [forged]), tls=tls)
    raw.received(1.0)
    raw.close()
    if tls is None:
        wait_until(lambda: _holds(cluster, follower, key, a.status[follower].last_offset), 15.0,
                   "the forged record on the follower (plain connections authenticate no one)")
        pytest.xfail("over a plain connection any process can claim a member's id: only mutual TLS stops it")
    a.check_unmoved()
    a.assert_nowhere(key)


def _holds(c: NodeCluster, node: int, key: str, start: int) -> bool:
    with Client(c.endpoints, timeout=10.0) as client:
        return any(e.key == key for e in client.read_events(GROUP, start, endpoint=c.endpoint(node)).events)


def test_a_cluster_whose_term_passed_the_limit_starts_and_says_why(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    """What issue 18's vote left on disk: the kv term at 10^12 + 1 in every node's quorum-state. Every
    start used to campaign, lead, and exit on the int32 epoch of its no-op. Now every node starts and
    stays up; the kv group elects no one, and each node says why (CRITICAL, epochlog_term_exhausted);
    the other groups serve."""
    c = node_cluster_factory(raft={"election_timeout_ticks": 10})
    c.start()
    c.wait_converged(GROUP, timeout=60)   # every member holds the leader's term: each has a quorum-state
    assert set(c.stop_all().values()) == {0}
    for n in c.nodes.values():
        path = n.data_dir / "groups" / GROUP / "quorum-state"
        state = json.loads(path.read_text())
        state.update(term=10**12 + 1, vote=0)
        path.write_text(json.dumps(state))
    c.start()
    wait_until(lambda: all("term 1000000000001 is at the limit 2147483647" in c.nodes[n].stderr() for n in c.nodes),
               15.0, "the CRITICAL line on every node")
    for group in c.groups:
        if group != GROUP:
            c.leader(group)
    time.sleep(2.0)   # several election timeouts
    assert c.running() == list(c.nodes), c.describe()
    for n in c.nodes:
        info = c.wait_group_status(n, GROUP)
        assert info.leader == 0 and info.term == 10**12 + 1, info
        wait_until(lambda: c.metrics(n).get(("epochlog_term_exhausted", (("group", GROUP),))) == 1, 10.0,
                   f"epochlog_term_exhausted of {GROUP} on node {n}")
        assert "CRITICAL" in c.nodes[n].stderr()
