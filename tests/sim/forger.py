"""The forger nemesis: messages no honest member sends, handed to live servers as if off the network.

Every forged message must be dropped by the peer checks (eventlog/raft/peer_check.py) before the
core sees it; the `PeerChecks` checker fails the seed ("forged-accepted") the moment one is not.
Each is built from the target's state at that moment, so the checks are tried in every state the
seed reaches (mid-election, mid-membership-change, lagging, leading, installing a snapshot). The
classes, each something the node runtime met or must refuse (issue 18):

- stranger: a node id that was never a member (not in the address book) sends any kind of message,
  with plausible fields and a term at or above the target's (a leader's messages only to a target
  that is a member itself: a node being added takes any leader, see peer_check);
- spoofed: the message names another member than the peer that sent it;
- misdirected: the message is for another node;
- beyond the term limit: a member's message with a term above MAX_TERM (the int32 epoch);
- malformed: a member's append whose entries leave a gap, cover no index, run ahead of its term or
  go back in term; a no-op covering two indexes; a negative prev index or commit;
- bad snapshot chunk: a member's chunk that runs past its snapshot, or ends short of it but says
  it is the last;
- impossible answers, to a leader: an acknowledgement beyond its log, an answer to a heartbeat
  round it never started;
- a second leader: a member's leader message in the target's term when the target knows another
  leader of that term;
- a log shape no leader sends, in the name of the target's leader, in its term and right where the
  target's log is: a configuration change that does not apply (removing a node that is not a
  member), an append after an index inside a batch, a batch the target holds in other boundaries, a
  commit index inside a batch.

The forged messages never reach a core (they are all dropped, or the seed fails), so the rest of
the run is the one the seed would have without them. Not thread-safe; one per simulation run.
"""

from __future__ import annotations

import random

from eventlog.raft.confchange import encode_conf_change
from eventlog.raft.node import Role
from eventlog.raft.types import (
    MAX_TERM,
    Append,
    AppendResp,
    ConfChange,
    ConfChangeKind,
    Entry,
    EntryKind,
    Heartbeat,
    HeartbeatResp,
    InstallSnapshot,
    Message,
    PreVote,
    SnapshotMeta,
    TimeoutNow,
    Vote,
)
from tests.sim.cluster import Cluster
from tests.sim.replica import Replica

STRANGER = 1000    # ids from here on were never members (the simulator's nodes are numbered from 1)
CLASSES = ("stranger", "spoofed", "misdirected", "term_limit", "malformed", "snapshot_chunk", "impossible_answer",
           "second_leader", "log_shape")


class Forger:
    def __init__(self, cluster: Cluster, rng: random.Random, prob: float) -> None:
        self.cluster = cluster
        self.rng = rng
        self.prob = prob
        self.enabled = True
        self.counts: dict[str, int] = dict.fromkeys(CLASSES, 0)

    def step(self, now: int) -> None:
        if not self.enabled or not self.prob or self.rng.random() >= self.prob:
            return
        reachable = self.cluster.reachable_ids()
        if not reachable:
            return
        target = self.cluster.replicas[self.rng.choice(reachable)]
        kind = self.rng.choice(CLASSES)
        forged = self._forge(kind, target)
        if forged is not None:
            peer, m = forged
            self.counts[kind] += 1
            target.receive(peer, m, forged=True)

    def _forge(self, kind: str, r: Replica) -> tuple[int, Message] | None:
        n = r.node
        assert n is not None
        rng = self.rng
        members = [v for c in n.confs_since(n.log.committed) for v in c.voters + c.learners if v != r.id]
        member = rng.choice(members) if members else None
        term = n.term + rng.randint(0, 3)
        last, last_term = n.log.last_index(), n.log.last_term()
        if kind == "stranger":
            s = STRANGER + rng.randrange(1000)
            in_own_view = any(c.contains(r.id) for c in n.confs_since(n.log.committed))
            choices = [Vote(term=term + 1, src=s, dst=r.id, last_index=last + 5, last_term=term, transfer=True),
                       PreVote(term=term + 1, src=s, dst=r.id, last_index=last + 5, last_term=term),
                       AppendResp(term=term + 1, src=s, dst=r.id, index=-1, reject=True)]
            if in_own_view:
                choices += [Append(term=term, src=s, dst=r.id, prev_index=last, prev_term=last_term,
                                   entries=(Entry(index=last + 1, term=term, data=b"forged"),), commit=last + 1),
                            Heartbeat(term=term, src=s, dst=r.id, commit=last),
                            TimeoutNow(term=term, src=s, dst=r.id)]
            return s, rng.choice(choices)
        if member is None:
            return None
        if kind == "spoofed":
            claimed = rng.choice([v for v in (*members, r.id, STRANGER) if v != member])
            return member, Heartbeat(term=term, src=claimed, dst=r.id, commit=last)
        if kind == "misdirected":
            dst = rng.choice([v for v in (*members, STRANGER) if v != r.id])
            return member, Heartbeat(term=term, src=member, dst=dst, commit=last)
        if kind == "term_limit":
            big = MAX_TERM + rng.choice([1, rng.randrange(1, 10**12)])
            return member, rng.choice([
                Vote(term=big, src=member, dst=r.id, last_index=last + 5, last_term=big - 1, transfer=True),
                Heartbeat(term=big, src=member, dst=r.id, commit=last),
                Append(term=max(term, 1), src=member, dst=r.id, prev_index=last, prev_term=last_term,
                       entries=(Entry(index=last + 1, term=big),), commit=-1)])
        if kind == "malformed":
            t = max(term, last_term, 1)
            e = Entry(index=last + 1, term=t, data=b"x")
            entries = rng.choice([
                (Entry(index=last + 2, term=t),),                                   # a gap
                (Entry(index=last + 1, term=t, count=0),),                          # no index
                (Entry(index=last + 1, term=t + 1),),                               # ahead of the append's term
                (e, Entry(index=last + 2, term=t - 1)) if t > 1 else (Entry(index=last + 1, term=0),),  # back in term
                (Entry(index=last + 1, term=t, count=2, kind=EntryKind.NOOP),),     # a no-op over two indexes
            ])
            return member, rng.choice([
                Append(term=t, src=member, dst=r.id, prev_index=last, prev_term=last_term, entries=entries, commit=-1),
                Append(term=t, src=member, dst=r.id, prev_index=-5, prev_term=0, entries=(), commit=-1),
                Heartbeat(term=t, src=member, dst=r.id, commit=-7)])
        if kind == "snapshot_chunk":
            meta = SnapshotMeta(index=max(0, last), term=max(1, last_term), conf=n.conf, size=10)
            return member, rng.choice([
                InstallSnapshot(term=max(term, meta.term), src=member, dst=r.id, meta=meta, offset=0, data=b"x" * 5,
                                done=True),
                InstallSnapshot(term=max(term, meta.term), src=member, dst=r.id, meta=meta, offset=8, data=b"x" * 5,
                                done=False),
                InstallSnapshot(term=max(term, meta.term), src=member, dst=r.id, meta=meta, offset=-2, data=b"x" * 12,
                                done=True)])
        if kind == "impossible_answer":
            if n.role is not Role.LEADER:
                return None
            return member, rng.choice([
                AppendResp(term=n.term, src=member, dst=r.id, index=last + rng.randint(1, 100)),
                HeartbeatResp(term=n.term, src=member, dst=r.id, ctx=n.heartbeat_round + rng.randint(1, 100))])
        if kind == "second_leader":
            other = [v for v in members if v != n.leader]
            if n.leader == 0 or not other:
                return None
            src = rng.choice(other)
            return src, rng.choice([Heartbeat(term=n.term, src=src, dst=r.id, commit=last),
                                    TimeoutNow(term=n.term, src=src, dst=r.id),
                                    Append(term=n.term, src=src, dst=r.id, prev_index=last, prev_term=last_term,
                                           entries=(), commit=last)])
        if kind == "log_shape":
            return self._log_shape(r)
        raise AssertionError(kind)

    def _log_shape(self, r: Replica) -> tuple[int, Message] | None:
        n = r.node
        assert n is not None
        leader, log = n.leader, n.log
        if leader in (0, r.id) or n.role is not Role.FOLLOWER:
            return None
        last, last_term = log.last_index(), log.last_term()
        remove = Entry(index=last + 1, term=n.term, kind=EntryKind.CONF_CHANGE,
                       data=encode_conf_change(ConfChange(ConfChangeKind.REMOVE, STRANGER)))
        choices: list[Message] = [Append(term=n.term, src=leader, dst=r.id, prev_index=last, prev_term=last_term,
                                         entries=(remove,), commit=-1)]
        batches = [e for e in log.unstable if e.count > 1 and e.index > log.committed]
        if not batches and last > log.committed and last >= log.first_index():
            first, end = log.entry_bounds(last)
            if end > first > log.committed:
                batches = [Entry(index=first, term=log.term(last) or 0, count=end - first + 1)]
        if batches:
            e = self.rng.choice(batches)
            choices += [
                Append(term=n.term, src=leader, dst=r.id, prev_index=e.index, prev_term=e.term,   # inside e
                       entries=(Entry(index=e.index + 1, term=e.term),), commit=-1),
                Append(term=n.term, src=leader, dst=r.id, prev_index=e.index - 1,                 # e, regrouped
                       prev_term=log.term(e.index - 1) or 0, entries=(Entry(index=e.index, term=e.term, count=1),),
                       commit=-1),
                Heartbeat(term=n.term, src=leader, dst=r.id, commit=e.index)]                     # commit inside e
        return leader, self.rng.choice(choices)
