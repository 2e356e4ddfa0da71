"""Regression tests for the core bugs the simulator found, each replayed as a small script against
the real core (the seed that found it is in each test's docstring; seeds are not stable across
simulator changes, these scripts are).
"""

from __future__ import annotations

import random
from msgspec.structs import replace
from collections.abc import Callable

from eventlog.raft import (
    ConfChange,
    ConfChangeKind,
    ConfState,
    Entry,
    MemoryStorage,
    Message,
    RaftConfig,
    RaftNode,
    Role,
    SnapshotMeta,
)
from eventlog.raft.peer_check import PeerCheck
from eventlog.raft.types import Append, AppendResp, HardState, Heartbeat, PreVote, TimeoutNow, Vote


class Group:
    """A few cores with perfect disks; messages wait in `queue` until delivered."""

    def __init__(self, voters: tuple[int, ...], learners: tuple[int, ...] = (), **cfg: object) -> None:
        conf = ConfState(voters=voters, learners=learners)
        self.cfg = RaftConfig(**{"election_timeout_ticks": 10, **cfg})  # type: ignore[arg-type]
        self.storage = {i: MemoryStorage(conf) for i in voters + learners}
        self.nodes = {i: RaftNode(i, s, self.cfg, random.Random(i)) for i, s in self.storage.items()}
        self.queue: list[Message] = []
        self.drop: Callable[[Message], bool] = lambda m: False

    def flush(self) -> None:
        for i, n in self.nodes.items():
            while n.has_ready():
                rd = n.ready()
                s = self.storage[i]
                for c in rd.snapshot_chunks:
                    s.stage_snapshot_chunk(c.meta, c.offset, c.data)
                if rd.snapshot is not None:
                    s.install_snapshot(rd.snapshot)
                s.append(rd.entries)
                if rd.hard_state is not None:
                    s.set_hard_state(rd.hard_state)
                self.queue += [m for m in rd.send_now + rd.send_after if not self.drop(m)]
                n.advance()

    def deliver(self, rounds: int = 50) -> None:
        for _ in range(rounds):
            self.flush()
            if not self.queue:
                return
            msgs, self.queue = self.queue, []
            for m in msgs:
                if m.dst in self.nodes and not self.drop(m):
                    self.nodes[m.dst].step(m)

    def tick(self, ticks: int) -> None:
        for _ in range(ticks):
            for n in self.nodes.values():
                n.tick()
            self.deliver()

    def leader(self) -> RaftNode | None:
        leaders = [n for n in self.nodes.values() if n.role is Role.LEADER]
        return max(leaders, key=lambda n: n.term) if leaders else None


def test_leader_whose_removal_commits_steps_down_cleanly() -> None:
    """Seed 5: the AppendResp that committed the leader's own removal made it step down inside
    _maybe_commit, then _handle_append_resp kept sending from the emptied progress map (KeyError)."""
    g = Group((1, 2, 3))
    g.nodes[1].campaign()
    g.deliver()
    g.nodes[1].propose_conf_change(ConfChange(ConfChangeKind.REMOVE, 1))
    g.deliver()
    assert g.nodes[1].role is Role.FOLLOWER
    assert g.nodes[2].conf.voters == (2, 3) and g.nodes[3].conf.voters == (2, 3)


def test_install_keeps_the_chunks_of_a_newer_snapshot() -> None:
    """Seed 61: the last chunk of snapshot 19 and the first chunk of snapshot 22 came in one Ready;
    installing 19 dropped every staged buffer, and installing 22 later found bytes missing."""
    s = MemoryStorage(ConfState(voters=(1,)))
    old, new = SnapshotMeta(index=19, term=8, size=4), SnapshotMeta(index=22, term=8, size=6)
    s.stage_snapshot_chunk(old, 0, b"abcd")
    s.stage_snapshot_chunk(new, 0, b"xyz")
    s.install_snapshot(old)
    s.stage_snapshot_chunk(new, 3, b"uvw")
    s.install_snapshot(new)
    assert s.snapshot() == new and s.snapshot_data() == b"xyzuvw"


def test_install_replaces_the_whole_log() -> None:
    """Seed 789: install_snapshot compared the stored term at the snapshot index after replacing the
    snapshot (so always with itself) and kept a conflicting suffix; the core's log view then ended at
    the snapshot while storage went on (IndexError in RaftLog.entry_bounds)."""
    s = MemoryStorage(ConfState(voters=(1,)))
    s.append([Entry(index=i, term=2) for i in range(19)])
    meta = SnapshotMeta(index=16, term=4, size=1)
    s.stage_snapshot_chunk(meta, 0, b"x")
    s.install_snapshot(meta)
    assert (s.first_index(), s.last_index(), s.term(16)) == (17, 16, 4)


def test_voter_removed_by_an_uncommitted_entry_still_campaigns() -> None:
    """Seed 190: the leader of {1, 2} appended "remove 1" and lost leadership before replicating it.
    Node 2 (config {1, 2}) needs node 1's vote, which node 1 refuses (its log is longer); node 1 did
    not campaign because it was not in its own latest config. Thesis §4.2.2: it must."""
    g = Group((1, 2))
    g.nodes[1].campaign()
    g.deliver()
    g.drop = lambda m: m.src == 1 or m.dst == 1            # node 1 is cut off ...
    g.nodes[1].propose_conf_change(ConfChange(ConfChangeKind.REMOVE, 1))
    g.tick(30)                                             # ... and steps down (check quorum)
    assert g.leader() is None
    g.drop = lambda m: False
    g.tick(100)
    leader = g.leader()
    assert leader is not None and leader.id == 2 and leader.conf.voters == (2,)


def test_a_leader_that_sent_timeout_now_never_serves_lease_reads_again() -> None:
    """Seed 1186: the transfer timed out while the TimeoutNow was still in flight; the old leader
    took requests again and served lease reads while the target won an election with transfer
    votes, which ignore the followers' leader lease."""
    g = Group((1, 2, 3), heartbeat_interval_ticks=1)
    g.nodes[1].campaign()
    g.deliver()
    g.tick(3)
    leader = g.nodes[1]
    assert leader.lease_read_index() is not None
    g.drop = lambda m: isinstance(m, TimeoutNow)           # delayed, not lost
    leader.transfer_leadership(2)
    g.deliver()
    g.tick(g.cfg.election_timeout_ticks + 1)               # the transfer times out
    assert leader.role is Role.LEADER and leader.lead_transferee == 0
    assert leader.lease_read_index() is None
    leader.read_index(7)                                   # ReadIndex does not rely on time
    g.tick(2)


def test_a_node_that_cannot_campaign_tells_a_stale_leader_its_term() -> None:
    """Seed 8499: without pre-vote and check-quorum a node with a higher term ignored the leader's
    appends, relying on its own campaign to fix the term; a node that cannot campaign (a learner, a
    voter whose log does not say so yet) never did, and never caught up."""
    g = Group((1,), learners=(2,), pre_vote=False, check_quorum=False)
    g.nodes[1].campaign()
    g.deliver()
    learner = g.nodes[2]
    learner.step(Vote(term=5, src=9, dst=2, last_index=0, last_term=0))   # some candidate's term
    learner.ready()
    learner.advance()
    learner.step(Heartbeat(term=g.nodes[1].term, src=1, dst=2, commit=0))
    rd = learner.ready()
    assert any(isinstance(m, AppendResp) and m.term == 5 and m.reject for m in rd.send_after)
    learner.advance()


def test_the_election_after_a_won_pre_vote_respects_leases() -> None:
    """Seed 1186's trace: after a pre-vote the real election sent Vote(transfer=True), so voters
    ignored their leader lease in every ordinary election, not just in leadership transfers."""
    g = Group((1, 2, 3))
    votes: list[Vote] = []
    g.drop = lambda m: isinstance(m, Vote) and votes.append(m) is not None
    g.nodes[1].campaign()
    g.deliver()
    assert votes and not any(v.transfer for v in votes)


def test_a_restarted_follower_does_not_help_elect_anyone_for_an_election_timeout() -> None:
    """Found by tests/eventlog/raft/test_paper.py (the simulator never lined it up: the candidate's pre-vote
    and vote must both reach the restarted node before the leader's next heartbeat). Node 2 backs
    leader 1's lease, restarts at once and used to grant node 3's votes at once: node 3 (cut off
    from node 1) won while node 1 still served lease reads."""
    g = Group((1, 2, 3), heartbeat_interval_ticks=1)
    g.nodes[1].campaign()
    g.deliver()
    g.drop = lambda m: {m.src, m.dst} == {1, 3}
    g.tick(2)
    assert g.nodes[1].lease_read_index() is not None
    g.nodes[2] = RaftNode(2, g.storage[2], g.cfg, random.Random(22))     # crash + restart
    g.nodes[3].campaign()
    g.deliver()
    assert g.nodes[3].role is not Role.LEADER
    fresh = Group((1, 2, 3))                                              # a new cluster is exempt
    fresh.nodes[1].campaign()
    fresh.deliver()
    assert fresh.nodes[1].role is Role.LEADER


def test_entries_replaced_while_their_ready_is_out_are_handed_out_again() -> None:
    """Seeds 502341, 503653, 507138 (after pipelined persistence landed): a newer leader replaced
    entries of a Ready between ready() and accept(); accept() then marked everything through that
    Ready's last entry as handed off, so the replacement never reached the disk -- yet was
    acknowledged -- and the next entry was appended on top of the stale one (log-matching)."""
    s = MemoryStorage(ConfState(voters=(1, 2, 3)))
    n = RaftNode(2, s, RaftConfig(election_timeout_ticks=10), random.Random(2))
    n.step(Append(term=1, src=1, dst=2, prev_index=-1, prev_term=0,
                  entries=(Entry(index=0, term=1), Entry(index=1, term=1), Entry(index=2, term=1)), commit=-1))
    rd = n.ready()                                           # entries 0..2 of term 1, being written
    n.step(Append(term=2, src=3, dst=2, prev_index=0, prev_term=1, entries=(Entry(index=1, term=2),), commit=-1))
    s.append(rd.entries)
    assert rd.hard_state is not None
    s.set_hard_state(rd.hard_state)
    n.advance()
    rd = n.ready()
    assert [(e.index, e.term) for e in rd.entries] == [(1, 2)]
    s.append(rd.entries)
    n.advance()
    assert (s.last_index(), s.term(1)) == (1, 2)



def test_a_node_whose_crash_kept_entries_but_not_their_term_campaigns_in_that_term() -> None:
    """Seed 731068: a torn write (the Ready that moved node 1 to term 2 and appended entries of term 2
    reached the disk without its hard state, written after them) restarted node 1 at term 1 with a log
    ending in term 2; its PreVote (term 2, last term 2) was dropped by every peer as malformed (a
    node's term is never below its last entry's), so it could not win an election."""
    def storage(hard_term: int) -> MemoryStorage:
        s = MemoryStorage(ConfState(voters=(1, 2, 3)))
        s.append([Entry(index=i, term=1 + i // 3) for i in range(6)])   # entries of terms 1 and 2
        s.set_hard_state(HardState(term=hard_term, vote=1, commit=-1))
        return s
    cfg = RaftConfig(election_timeout_ticks=10, pre_vote=True)
    torn = RaftNode(1, storage(1), cfg, random.Random(1))                # the term before its last entry
    assert (torn.term, torn.vote) == (2, 0)
    rd = torn.ready()
    assert rd.hard_state is not None and rd.hard_state.term == 2         # the raised term is persisted
    torn.advance()
    torn.campaign()
    rd = torn.ready()
    requests = [m for m in rd.send_now + rd.send_after if isinstance(m, PreVote)]
    assert len(requests) == 2
    peer = RaftNode(2, storage(2), cfg, random.Random(2))
    for m in requests:
        assert PeerCheck(known_peer=lambda _: True).check(peer, 1, replace(m, dst=2)) is None, m
    whole = RaftNode(1, storage(3), cfg, random.Random(1))               # a term above the log's stays
    assert (whole.term, whole.vote) == (3, 1)
