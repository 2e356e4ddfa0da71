"""Invariant checkers: separate objects hooked to replica events (STYLE practice 13).

The cluster never checks anything itself; it reports what happened through `Hooks`, which fans
each event out to every checker. A checker keeps its own record of what it has seen and raises
`InvariantViolation` (naming the invariant) the moment one breaks, so the run stops at the first
violation with the state still there to inspect.

Events: a node became leader (seen after every input to its core), a leader advanced its commit
index, a Ready was persisted, an entry was applied, a snapshot was installed, a node crashed, a node (re)started, the run ended.

Invariants (Raft paper figure 3, thesis chapter 3, and what the application relies on):

- election-safety: at most one leader per term;
- vote-durability: a node never votes for two candidates in one term, and its durable term never
  goes back, across crashes;
- log-matching: two persisted entries with the same index and term are identical (same batch,
  kind, data) and follow an entry of the same term, so (by induction) the logs are identical up to
  them;
- committed-prefix: every node applies the same entry at every index, in order, each index once per
  incarnation, and a snapshot installed at index i has the term of the entry applied at i;
- commit-durability: the durable commit index never decreases, is always covered by the durable
  log, and a restarted node knows at least as much as committed as it had applied before the crash
  (pipelined replicas: the contract lets them apply before a commit-only hard state is durable, so
  there only: the restarted node's durable log or snapshot still holds everything it had applied);
- leader-completeness: a new leader of term t holds every entry committed in a term below t (the
  paper's wording: "if a log entry is committed in a given term, then that entry will be present
  in the logs of the leaders for all higher-numbered terms"). An entry's commit term is the lowest
  term of a leader seen committing it. Not every entry applied so far: a candidate paused with
  its election undecided may step the granted votes of its old term after a later term committed
  more, and legitimately lead that old term until it hears of the new one;
- lease-safety: while a leader serves reads from its lease (term t), no node has been elected in a
  term above t -- the lease's promise (thesis §6.4.1), checked directly rather than through the
  rare client history that would expose a stale read;
- state-digest: all replicas that applied through index i have identical KV + membership state
  (digest) at i, whether they got there by applying entries or by installing a snapshot;
- linearizability: the client history of KV operations is linearizable (at the end of the run);
- peer-checks (eventlog/raft/peer_check.py): every message the forger made (tests/sim/forger.py) is
  dropped before the core sees it ("forged-accepted" otherwise), and an honest message is dropped
  only as stale -- from a server that is no longer a member as the receiver sees it -- never for
  its identity, its fields, its term, its log shape or its leadership ("false-drop": a check that
  would cost an honest cluster its messages).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eventlog.raft.errors import CompactedError, UnavailableError
from eventlog.raft.node import Ready
from eventlog.raft.peer_check import NOT_MEMBER, Drop
from eventlog.raft.types import Entry, HardState, Message, SnapshotMeta
from tests.sim.history import History
from tests.sim.linearizability import check_history

if TYPE_CHECKING:
    from tests.sim.replica import Replica


class InvariantViolation(Exception):
    def __init__(self, invariant: str, detail: str) -> None:
        self.invariant = invariant
        self.detail = detail
        super().__init__(f"{invariant}: {detail}")


class Checker:
    """Base: every hook is a no-op."""

    def became_leader(self, r: Replica, term: int) -> None: ...
    def leader_committed(self, r: Replica, term: int, index: int) -> None: ...
    def persisted(self, r: Replica, rd: Ready) -> None: ...
    def applied(self, r: Replica, entry: Entry) -> None: ...
    def snapshot_installed(self, r: Replica, meta: SnapshotMeta) -> None: ...
    def crashed(self, r: Replica, applied: int) -> None: ...
    def restarted(self, r: Replica, hard: HardState) -> None: ...
    def lease_read(self, r: Replica, term: int, index: int) -> None: ...
    def peer_message(self, r: Replica, peer: int, m: Message, drop: Drop | None, forged: bool) -> None: ...
    def finish(self) -> None: ...


class Hooks:
    """What replicas report to; fans each event out to the checkers, in order."""

    def __init__(self, checkers: list[Checker]) -> None:
        self.checkers = checkers

    def became_leader(self, r: Replica, term: int) -> None:
        for c in self.checkers:
            c.became_leader(r, term)

    def leader_committed(self, r: Replica, term: int, index: int) -> None:
        for c in self.checkers:
            c.leader_committed(r, term, index)

    def persisted(self, r: Replica, rd: Ready) -> None:
        for c in self.checkers:
            c.persisted(r, rd)

    def applied(self, r: Replica, entry: Entry) -> None:
        for c in self.checkers:
            c.applied(r, entry)

    def snapshot_installed(self, r: Replica, meta: SnapshotMeta) -> None:
        for c in self.checkers:
            c.snapshot_installed(r, meta)

    def crashed(self, r: Replica, applied: int) -> None:
        for c in self.checkers:
            c.crashed(r, applied)

    def restarted(self, r: Replica, hard: HardState) -> None:
        for c in self.checkers:
            c.restarted(r, hard)

    def lease_read(self, r: Replica, term: int, index: int) -> None:
        for c in self.checkers:
            c.lease_read(r, term, index)

    def peer_message(self, r: Replica, peer: int, m: Message, drop: Drop | None, forged: bool) -> None:
        for c in self.checkers:
            c.peer_message(r, peer, m, drop, forged)

    def finish(self) -> None:
        for c in self.checkers:
            c.finish()


class ElectionSafety(Checker):
    def __init__(self) -> None:
        self.leaders: dict[int, int] = {}

    def became_leader(self, r: Replica, term: int) -> None:
        other = self.leaders.setdefault(term, r.id)
        if other != r.id:
            raise InvariantViolation("election-safety", f"nodes {other} and {r.id} both led term {term}")


class VoteDurability(Checker):
    def __init__(self) -> None:
        self.votes: dict[tuple[int, int], int] = {}    # (node, term) -> durable vote
        self.terms: dict[int, int] = {}                # node -> durable term

    def persisted(self, r: Replica, rd: Ready) -> None:
        hs = rd.hard_state
        if hs is None:
            return
        if hs.term < self.terms.get(r.id, 0):
            raise InvariantViolation("vote-durability",
                                     f"node {r.id} persisted term {hs.term} after term {self.terms[r.id]}")
        self.terms[r.id] = hs.term
        if hs.vote:
            prev = self.votes.setdefault((r.id, hs.term), hs.vote)
            if prev != hs.vote:
                raise InvariantViolation("vote-durability",
                                         f"node {r.id} voted for {prev} and then {hs.vote} in term {hs.term}")

    def restarted(self, r: Replica, hard: HardState) -> None:
        if hard.term < self.terms.get(r.id, 0):
            raise InvariantViolation("vote-durability", f"node {r.id} restarted at term {hard.term}, "
                                     f"it had persisted term {self.terms[r.id]}")


class LogMatching(Checker):
    def __init__(self) -> None:
        # (index, term) -> (entry, term of the entry before it or None when compacted)
        self.seen: dict[tuple[int, int], tuple[Entry, int | None]] = {}

    def persisted(self, r: Replica, rd: Ready) -> None:
        if not rd.entries:
            return
        storage = r.disk.durable
        try:
            prev: int | None = storage.term(rd.entries[0].index - 1)
        except (CompactedError, UnavailableError):
            prev = None
        for e in rd.entries:
            known = self.seen.get((e.index, e.term))
            if known is None:
                self.seen[(e.index, e.term)] = (e, prev)
            else:
                other, other_prev = known
                if other != e:
                    raise InvariantViolation("log-matching", f"node {r.id} persisted {e!r}, another node {other!r}")
                if prev is not None and other_prev is not None and prev != other_prev:
                    raise InvariantViolation(
                        "log-matching", f"node {r.id}: entry ({e.index}, term {e.term}) follows term {prev}, "
                        f"elsewhere it follows term {other_prev}")
                if prev is None and other_prev is not None:
                    self.seen[(e.index, e.term)] = (e, prev if prev is not None else other_prev)
            prev = e.term


class CommittedPrefix(Checker):
    def __init__(self) -> None:
        self.at: dict[int, Entry] = {}          # every committed index -> the entry covering it
        self.next: dict[int, int] = {}          # node -> next index it must apply
        self.last: Entry | None = None

    def applied(self, r: Replica, entry: Entry) -> None:
        want = self.next.get(r.id, 0)
        if entry.index != want:
            raise InvariantViolation("committed-prefix", f"node {r.id} applied {entry.index}, expected {want}")
        self.next[r.id] = entry.last_index + 1
        for i in range(entry.index, entry.last_index + 1):
            other = self.at.setdefault(i, entry)
            if other != entry:
                raise InvariantViolation("committed-prefix",
                                         f"node {r.id} applied {entry!r} at {i}, another node applied {other!r}")
        if self.last is None or entry.last_index > self.last.last_index:
            self.last = entry

    def snapshot_installed(self, r: Replica, meta: SnapshotMeta) -> None:
        other = self.at.get(meta.index)
        if other is not None and (other.term != meta.term or other.last_index != meta.index):
            raise InvariantViolation("committed-prefix", f"node {r.id} installed snapshot ({meta.index}, term "
                                     f"{meta.term}), the committed entry there is {other!r}")
        self.next[r.id] = meta.index + 1

    def restarted(self, r: Replica, hard: HardState) -> None:
        self.next[r.id] = r.disk.durable.snapshot().index + 1


class CommitDurability(Checker):
    def __init__(self, pipelined: bool = False) -> None:
        self.pipelined = pipelined
        self.commit: dict[int, int] = {}        # node -> durable commit index
        self.applied_before_crash: dict[int, int] = {}

    def persisted(self, r: Replica, rd: Ready) -> None:
        hs = rd.hard_state
        if hs is None:
            return
        if hs.commit < self.commit.get(r.id, -1):
            raise InvariantViolation("commit-durability", f"node {r.id} persisted commit {hs.commit} "
                                     f"after commit {self.commit[r.id]}")
        self.commit[r.id] = hs.commit
        if hs.commit > r.disk.durable.last_index():
            raise InvariantViolation("commit-durability", f"node {r.id} persisted commit {hs.commit} beyond its "
                                     f"durable log (last index {r.disk.durable.last_index()})")

    def crashed(self, r: Replica, applied: int) -> None:
        self.applied_before_crash[r.id] = applied

    def restarted(self, r: Replica, hard: HardState) -> None:
        storage = r.disk.durable
        if hard.commit > storage.last_index():
            raise InvariantViolation("commit-durability", f"node {r.id} restarted with commit {hard.commit} "
                                     f"beyond its durable log (last index {storage.last_index()})")
        before = self.applied_before_crash.get(r.id, -1)
        assert r.node is not None
        if self.pipelined:
            if max(storage.last_index(), storage.snapshot().index) < before:
                raise InvariantViolation("commit-durability", f"node {r.id} had applied {before} before crashing, "
                                         f"its durable log ends at {storage.last_index()}")
        elif r.node.log.committed < before:
            raise InvariantViolation("commit-durability", f"node {r.id} had applied {before} before crashing, "
                                     f"restarted with commit {r.node.log.committed}")


class LeaderCompleteness(Checker):
    """Needs the committed entries: reads them from the CommittedPrefix checker it is given."""

    def __init__(self, committed: CommittedPrefix) -> None:
        self.committed = committed
        self.commit_by_term: dict[int, int] = {}   # term -> highest index a leader of it committed

    def leader_committed(self, r: Replica, term: int, index: int) -> None:
        self.commit_by_term[term] = max(index, self.commit_by_term.get(term, -1))

    def _committed_before(self, term: int) -> int:
        """The highest index committed in a term below `term` (a leader committing an index commits
        every index below it too); -1: none."""
        return max((i for t, i in self.commit_by_term.items() if t < term), default=-1)

    def became_leader(self, r: Replica, term: int) -> None:
        node = r.node
        assert node is not None
        log = node.log
        snap = log.snapshot_index()
        at = self.committed.at
        i = self.committed.last.last_index if self.committed.last is not None else -1
        i = min(i, self._committed_before(term))
        if i in at:
            i = at[i].last_index   # an entry commits whole
        while i > snap and i in at:
            e = at[i]
            if log.term(i) != e.term or log.entry_bounds(i) != (e.index, e.last_index):
                raise InvariantViolation("leader-completeness", f"node {r.id} leads term {term} without the "
                                         f"committed entry {e!r} (its log has term {log.term(i)} there)")
            i = e.index - 1
        if i == snap and i in at and log.term(i) != at[i].term:
            raise InvariantViolation("leader-completeness", f"node {r.id} leads term {term} with snapshot "
                                     f"({snap}, term {log.term(i)}), the committed entry there is {at[i]!r}")


class LeaseSafety(Checker):
    def __init__(self) -> None:
        self.elected: dict[int, int] = {}   # term -> leader, every election so far
        self.max_term = 0

    def became_leader(self, r: Replica, term: int) -> None:
        self.elected[term] = r.id
        self.max_term = max(self.max_term, term)

    def lease_read(self, r: Replica, term: int, index: int) -> None:
        if self.max_term > term:
            raise InvariantViolation("lease-safety", f"node {r.id} serves a lease read at index {index} as leader "
                                     f"of term {term}, but node {self.elected[self.max_term]} was elected in "
                                     f"term {self.max_term}")


class StateDigest(Checker):
    def __init__(self) -> None:
        self.digests: dict[int, tuple[bytes, int]] = {}   # index -> (digest, first node to report it)

    def _check(self, r: Replica, index: int, how: str) -> None:
        d = r.kv.digest()
        other = self.digests.setdefault(index, (d, r.id))
        if other[0] != d:
            raise InvariantViolation("state-digest", f"node {r.id} state at {index} ({how}) differs from node "
                                     f"{other[1]}'s: {sorted(r.kv.data.items())} conf {r.kv.conf}")

    def applied(self, r: Replica, entry: Entry) -> None:
        self._check(r, entry.last_index, "applied")

    def snapshot_installed(self, r: Replica, meta: SnapshotMeta) -> None:
        self._check(r, meta.index, "snapshot")

    def restarted(self, r: Replica, hard: HardState) -> None:
        if r.kv.applied >= 0:
            self._check(r, r.kv.applied, "restored")


class Linearizability(Checker):
    def __init__(self, history: History) -> None:
        self.history = history
        self.inconclusive = False
        self.inconclusive_detail = ""

    def finish(self) -> None:
        self.history.close()
        verdict = check_history(self.history.checked_ops())
        if not verdict.ok:
            raise InvariantViolation("linearizability", verdict.detail)
        self.inconclusive = verdict.inconclusive
        if verdict.inconclusive:
            self.inconclusive_detail = f"key {verdict.key!r}: {verdict.detail}"


class PeerChecks(Checker):
    """Forged messages are all dropped; honest ones only as stale (see the module docstring)."""

    STALE = frozenset({NOT_MEMBER})

    def __init__(self) -> None:
        self.honest_drops: dict[str, int] = {}
        self.forged = 0

    def peer_message(self, r: Replica, peer: int, m: Message, drop: Drop | None, forged: bool) -> None:
        if forged:
            self.forged += 1
            if drop is None:
                raise InvariantViolation("forged-accepted", f"n{r.id} ({r.node!r}) took {m!r} from peer {peer}")
        elif drop is not None:
            self.honest_drops[drop.reason] = self.honest_drops.get(drop.reason, 0) + 1
            if drop.reason not in self.STALE:
                raise InvariantViolation("false-drop", f"n{r.id} ({r.node!r}) dropped an honest {m!r}: "
                                                       f"{drop.reason}: {drop.detail}")


def standard_checkers(history: History, *, pipelined: bool = False) -> list[Checker]:
    committed = CommittedPrefix()
    return [ElectionSafety(), VoteDurability(), LogMatching(), committed, CommitDurability(pipelined),
            LeaderCompleteness(committed), LeaseSafety(), StateDigest(), PeerChecks(), Linearizability(history)]
