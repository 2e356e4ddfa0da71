"""One chaos run: the cluster, the clients, the nemesis, the heal and the checks (see __init__)."""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, cast

from epochlog.client import AsyncClient, Change, ClientError, InvalidArgumentError, RejectedError
from epochlog.client.errors import CompactedError
from eventlog.errors import EpochlogError
from statemachines.events import KvPut, decode_event
from tests.chaos.nemesis import GROUPS, Nemesis
from tests.chaos.observers import LogTail, Replay, WatchConsumer
from tests.chaos.versions import Read, check_versions
from tests.support.nodes import NodeCluster
from tests.sim.history import History
from tests.sim.linearizability import check_history

OP_TIMEOUT_S = 3.0   # a client call's timeout (the SDK's default is 10 s)
CONVERGE_S = 60.0
CATCH_UP_S = 30.0    # after convergence, for the log tail and the watch to reach the commit offset
# --compaction: snapshots, truncation (offsets), key compaction (metadata, kv) and history pruning run
# all the time, so faults land on them and lagging members catch up by log or by snapshot.
COMPACTION = {"retain_offsets": 300, "check_interval_ms": 100, "prune_interval_ms": 20,
              "cleaner": {"delete_retention_ms": 1000, "min_cleanable_dirty_ratio": 0.3}}
COMPACTION_LOG = {"segment_bytes": 64 << 10}
COMPACTION_SNAPSHOT_EVERY = 200
# --short-retention: --compaction with the history floor (and with it the window in which request ids
# are deduplicated) 150 offsets behind the applied offset and a snapshot every 100 offsets, so a member
# back from a fault catches up by snapshot: what an outside tester needed to see an acknowledged put
# applied twice (issue 17).
SHORT_RETENTION = {**COMPACTION, "retain_offsets": 150}
SHORT_RETENTION_SNAPSHOT_EVERY = 100


@dataclass(frozen=True, slots=True)
class ChaosParams:
    seconds: float
    seed: int
    clients: int = 6
    keys: int = 5
    op_timeout_s: float = OP_TIMEOUT_S
    nemesis_gap_s: tuple[float, float] = (1.0, 3.0)     # quiet time between two faults
    pause_s: tuple[float, float] = (0.5, 4.0)           # SIGSTOP length
    down_s: tuple[float, float] = (0.5, 3.0)            # kill -9 to restart
    isolate_s: tuple[float, float] = (1.0, 5.0)         # a partition (isolation or one-way cut) to its heal
    compaction: bool = False                            # see COMPACTION
    short_retention: bool = False                       # see SHORT_RETENTION (implies compaction)
    partitions: bool = False                            # the nemesis also cuts peer links (tests/chaos/nemesis.py)
    watch: bool = False                                 # a watch consumer's replay must equal the final views

    def flags(self) -> str:
        """The command-line flags of the modes on, for the replay line."""
        on = [("--compaction", self.compaction), ("--short-retention", self.short_retention),
              ("--partitions", self.partitions), ("--watch", self.watch)]
        timeout = [f"--op-timeout {self.op_timeout_s:g}"] if self.op_timeout_s != OP_TIMEOUT_S else []
        return "".join(f" {flag}" for flag in [name for name, yes in on if yes] + timeout)


@dataclass
class Outcome:
    violations: list[str] = field(default_factory=list)
    inconclusive: str = ""
    faults: Counter[str] = field(default_factory=Counter)
    ops: Counter[str] = field(default_factory=Counter)
    acked_writes: int = 0
    converged_s: float = -1.0
    commit: int = -1
    checked_from: int = 0     # the kv logs were compared from here (where every node holds them as written)
    digests_equal: int = 0    # groups whose views were compared after stopping (compaction runs)
    reads_checked: int = 0    # reads whose version was checked (tests/chaos/versions.py)
    tail: str = ""            # what the log tail covered
    watch: str = ""           # what the watch consumer did
    views_compared: int = 0   # nodes whose final views were compared with the replays

    @property
    def exit_code(self) -> int:
        return 1 if self.violations else 2 if self.inconclusive else 0


def cas_expected(seen: Sequence[tuple[int | None, int]], rng: random.Random) -> tuple[int | None, int]:
    """What a client's compare-and-set expects: (the value it saw, that value's version), mostly the
    latest it saw, sometimes an older one; (None, 0) -- "must not exist" -- when it saw nothing."""
    if not seen:
        return None, 0
    return seen[-1] if rng.random() < 0.8 else rng.choice(seen)


class Clients:
    """The workload: `clients` coroutines, one operation at a time each, recorded in `history`."""

    def __init__(self, endpoints: list[str], params: ChaosParams, rng: random.Random) -> None:
        self.endpoints = endpoints
        self.p = params
        self.rngs = [random.Random(rng.getrandbits(64)) for _ in range(params.clients)]
        self.keys = [f"chaos/k{i}" for i in range(params.keys)]
        self.history = History()
        self.stop = asyncio.Event()
        self.acked: list[tuple[str, int, int]] = []    # (key, value, offset) of acknowledged writes
        self.reads: list[Read] = []                     # reads that returned a value, with its version
        self.written: list[int] = []                    # the value of every write sent
        self._value = 0

    def _next_value(self) -> int:
        self._value += 1
        self.written.append(self._value)
        return self._value

    async def run(self) -> None:
        await asyncio.gather(*(self._client(i) for i in range(self.p.clients)))

    async def _client(self, cid: int) -> None:
        rng = self.rngs[cid]
        seen: dict[str, list[tuple[int | None, int]]] = {k: [] for k in self.keys}   # (value, version)
        async with AsyncClient(rng.sample(self.endpoints, len(self.endpoints)), timeout=self.p.op_timeout_s,
                               actor=f"chaos-{cid}") as client:
            while not self.stop.is_set():
                key = rng.choice(self.keys)
                kind = rng.choices(("put", "cas", "get"), weights=(3, 2, 3))[0]
                if kind == "get":
                    await self._get(client, cid, key, seen[key], "lease" if rng.random() < 0.25 else "linearizable")
                else:
                    await self._write(client, cid, key, kind, seen[key], rng)
                del seen[key][:-8]
                if rng.random() < 0.3:
                    await asyncio.sleep(rng.random() * 0.02)

    async def _get(self, client: AsyncClient, cid: int, key: str, seen: list[tuple[int | None, int]],
                   consistency: str) -> None:
        op = self.history.invoke(cid, "get", key, None, None, via=consistency, node=0)
        try:
            kv = await client.get(key, consistency=consistency)
        except InvalidArgumentError:
            raise
        except (ClientError, EpochlogError, TimeoutError, OSError):
            self.history.unknown(op)
            return
        value = None if kv is None else int(kv.value)
        self.history.ok(op, value)
        if kv is not None:
            seen.append((value, kv.version))
            self.reads.append(Read(cid, key, int(kv.value), kv.version, consistency))

    async def _write(self, client: AsyncClient, cid: int, key: str, kind: str, seen: list[tuple[int | None, int]],
                     rng: random.Random) -> None:
        value = self._next_value()
        expected_value, expected_version = cas_expected(seen, rng) if kind == "cas" else (None, None)
        op = (self.history.invoke(cid, "put", key, value, None, via="log", node=0) if kind == "put" else
              self.history.invoke(cid, "cas", key, expected_value, value, via="log", node=0))
        try:
            result = await client.put(key, b"%d" % value, expected_version=expected_version)
        except RejectedError:
            if kind != "cas":
                raise
            self.history.ok(op, False)    # committed, changed nothing: the version did not match
            return
        except InvalidArgumentError:
            raise
        except (ClientError, EpochlogError, TimeoutError, OSError):
            self.history.unknown(op)
            return
        self.history.ok(op, True if kind == "cas" else None)
        self.acked.append((key, value, result.offset))
        seen.append((value, result.offset))


class ChaosRun:
    def __init__(self, params: ChaosParams, root: Path | None = None, out: TextIO | None = None) -> None:
        import sys
        self.p = params
        self.out = out or sys.stdout
        self.keep = root is not None
        self.root = root or Path(tempfile.mkdtemp(prefix=f"chaos-{params.seed}-"))
        self.rng = random.Random(params.seed)

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def run(self) -> Outcome:
        p = self.p
        self.say(f"chaos: seed={p.seed} seconds={p.seconds} clients={p.clients} keys={p.keys}{p.flags()} "
                 f"dir={self.root} (replay: python -m tests.chaos --seconds {p.seconds:g} --seed {p.seed}{p.flags()})")
        extra: dict[str, Any] = {}
        if p.short_retention:
            extra = {"snapshot_every_entries": SHORT_RETENTION_SNAPSHOT_EVERY, "log": COMPACTION_LOG,
                     "compaction": SHORT_RETENTION}
        elif p.compaction:
            extra = {"snapshot_every_entries": COMPACTION_SNAPSHOT_EVERY, "log": COMPACTION_LOG,
                     "compaction": COMPACTION}
        cluster = NodeCluster(self.root / "cluster", seed=p.seed, name="chaos", proxied=p.partitions, **extra)
        outcome = Outcome()
        try:
            cluster.start()
            for g in GROUPS:
                cluster.leader(g, timeout=30)
            asyncio.run(self._run(cluster, outcome))
            if (p.compaction or p.short_retention) and outcome.converged_s >= 0:
                self._check_digests(cluster, outcome)
        finally:
            cluster.close()
        self._summary(outcome)
        if outcome.exit_code == 0 and not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            self.say(f"data kept in {self.root}")
        return outcome

    async def _run(self, cluster: NodeCluster, outcome: Outcome) -> None:
        p = self.p
        clients = Clients(cluster.endpoints, p, random.Random(self.rng.getrandbits(64)))
        nemesis = Nemesis(cluster, random.Random(self.rng.getrandbits(64)), self.out, partitions=p.partitions,
                          gap_s=p.nemesis_gap_s, pause_s=p.pause_s, down_s=p.down_s, isolate_s=p.isolate_s)
        tail = LogTail(cluster.endpoints)
        watcher = WatchConsumer(cluster.endpoints, p.op_timeout_s) if p.watch else None
        following = asyncio.ensure_future(tail.run())
        watching = asyncio.ensure_future(watcher.run()) if watcher is not None else None
        self.say("nemesis:")
        workload = asyncio.ensure_future(clients.run())
        faults = asyncio.ensure_future(asyncio.to_thread(nemesis.run))
        try:
            await asyncio.sleep(p.seconds)
        finally:
            nemesis.stop.set()
            clients.stop.set()
            tail.stop.set()
            await faults
            await asyncio.wait_for(workload, p.op_timeout_s * 3 + 10)
            await asyncio.wait_for(following, p.op_timeout_s * 3 + 10)
        outcome.faults = nemesis.faults
        # Heal: every link passes, every node runs and none is stopped.
        if cluster.net is not None:
            cluster.net.heal()
        for i in cluster.nodes:
            if cluster.nodes[i].running:
                cluster.resume(i)
            else:
                await asyncio.to_thread(cluster.restart, i)
        started = time.monotonic()
        stuck = await asyncio.to_thread(self._converge, cluster)
        if stuck:
            outcome.violations.append(f"no convergence within {CONVERGE_S:.0f}s: {stuck}")
        else:
            outcome.converged_s = time.monotonic() - started
        clients.history.close()
        self._count_ops(clients.history, outcome)
        verdict = check_history(clients.history.checked_ops())
        if not verdict.ok:
            outcome.violations.append(f"linearizability: {verdict.detail}")
        elif verdict.inconclusive:
            outcome.inconclusive = f"key {verdict.key}: {verdict.detail}"
        outcome.acked_writes = len(clients.acked)
        try:
            if not stuck:
                await self._check_replicas(cluster, clients, outcome)
                await self._check_observers(cluster, clients, tail, watcher, outcome)
        finally:
            if watching is not None:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
        outcome.violations += check_versions(clients.acked, clients.reads, tail.records, tail.coverage,
                                             clients.written)
        outcome.reads_checked = len(clients.reads)
        gaps = ", ".join(f"[{lo}, {hi})" for lo, hi in tail.gaps)
        outcome.tail = (f"{len(tail.records)} chaos records in offsets [0, {tail.next_offset})"
                        + (f" except compacted {gaps}" if gaps else ""))
        del outcome.violations[20:]

    async def _check_observers(self, cluster: NodeCluster, clients: Clients, tail: LogTail,
                               watcher: WatchConsumer | None, outcome: Outcome) -> None:
        """Once converged: the tail read through the commit offset, the watch delivered the last chaos
        event, and replaying each (the tail when it holds the whole log) yields every node's views."""
        commit = outcome.commit
        if not await tail.drain(commit, CATCH_UP_S):
            outcome.violations.append(f"the log tail did not reach the commit offset {commit} within {CATCH_UP_S:.0f}s "
                                      f"(next offset {tail.next_offset})")
            return
        last = max((o for o in tail.records if o <= commit), default=-1)
        replays: dict[str, Replay] = {}
        if not tail.gaps and all(r.applied is not None for r in tail.records.values()):
            replays["the log's replay"] = replay = Replay()
            for offset, event, applied in tail.events:
                if offset <= commit:
                    replay.apply(offset, event, applied)
        if watcher is not None:
            deadline = time.monotonic() + CATCH_UP_S
            while watcher.last_offset < last and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            outcome.violations += [f"watch: {problem}" for problem in watcher.problems[:5]]
            outcome.watch = (f"{watcher.events} events, {watcher.replay.skipped} marked not applied"
                             + ("" if watcher.flag_seen else " (the watch does not say `applied`)")
                             + (f", re-listed at offsets {watcher.relisted}" if watcher.relisted else "")
                             + (f", {len(watcher.errors)} watch calls failed (last: {watcher.errors[-1]:.100})"
                                if watcher.errors else ""))
            if watcher.last_offset < last:
                outcome.violations.append(f"watch: the last chaos event (offset {last}) was not delivered within "
                                          f"{CATCH_UP_S:.0f}s of convergence (last delivered: {watcher.last_offset})")
            else:
                replays["the watch's replay"] = watcher.replay
        names = list(clients.keys)
        differ: dict[tuple[str, str], list[int]] = {}   # (replay, its differences) -> nodes
        for i in cluster.nodes if replays else ():
            views: dict[str, tuple[int, int]] = {}
            async with AsyncClient([cluster.endpoint(i)], timeout=10) as client:
                for name in names:
                    kv = await client.get(name, consistency="local", min_offset=commit)
                    if kv is not None:
                        views[name] = (int(kv.value), kv.version)
            for what, replay in replays.items():
                diff = "; ".join(f"{n}: {replay.state.get(n)} vs {views.get(n)}" for n in names
                                 if replay.state.get(n) != views.get(n))
                if diff:
                    differ.setdefault((what, diff), []).append(i)
            outcome.views_compared += 1
        outcome.violations += [f"{what} differs from the views (value, version) of node(s) {nodes} at offset "
                               f"{commit}: {diff}" for (what, diff), nodes in differ.items()]

    def _converge(self, cluster: NodeCluster) -> str:
        """Wait until every member of every group applied its leader's commit offset and the leader
        knows it; what is still behind at the deadline ("" once converged)."""
        deadline = time.monotonic() + CONVERGE_S
        while True:
            behind = []
            for g in GROUPS:
                infos = {i: cluster.group_status(i, g) for i in cluster.nodes}
                leaders = [x for x in infos.values() if x is not None and x.role == "leader"]
                if not leaders:
                    behind.append(f"{g}: no leader")
                    continue
                lead = max(leaders, key=lambda x: x.term)
                behind += [f"{g}: node {i} " + ("unreachable" if x is None else f"applied {x.applied_offset}")
                           + f" < commit {lead.commit_offset}"
                           for i, x in infos.items() if x is None or x.applied_offset < lead.commit_offset]
                behind += [f"{g}: leader {lead.node}'s match for node {pe.id} is {pe.match_offset} < commit "
                           f"{lead.commit_offset}" for pe in lead.peers if pe.match_offset < lead.commit_offset]
            if not behind:
                return ""
            if time.monotonic() > deadline:
                return "; ".join(behind)
            time.sleep(0.2)

    @staticmethod
    def _count_ops(history: History, outcome: Outcome) -> None:
        for op in history.ops:
            label = op.kind if op.kind != "get" else f"get/{op.via}"
            outcome.ops[f"{label} {op.status.value}"] += 1

    async def _check_replicas(self, cluster: NodeCluster, clients: Clients, outcome: Outcome) -> None:
        """Every acknowledged write on every replica, at its offset, with its value; logs identical.

        With compaction on, a node holds its log record by record only from its full-history start and
        its views' history only from the history floor: acknowledged writes below are checked by
        `_check_digests` (equal views), and the logs are compared where all nodes hold them."""
        leader = await asyncio.to_thread(cluster.leader, "kv")
        info = await asyncio.to_thread(cluster.group_status, leader, "kv")
        assert info is not None, f"the kv leader {leader} does not answer"
        kv_commit = info.commit_offset
        outcome.commit = kv_commit
        logs: dict[int, dict[int, tuple[str, bytes | None, bool | None]]] = {}
        starts: dict[int, int] = {}
        for i in cluster.nodes:
            async with AsyncClient([cluster.endpoint(i)], timeout=10) as client:
                starts[i], logs[i] = await _read_log(client, cluster.endpoint(i), kv_commit)
                for key in clients.keys:
                    floor, changes = await _history(client, key, kv_commit)
                    for k, value, offset in clients.acked:
                        if k == key and offset >= floor and changes.get(offset) != value:
                            outcome.violations.append(
                                f"node {i}: the history of {key} lacks the acknowledged write of {value} at "
                                f"offset {offset} (it has {changes.get(offset)!r} there)")
        common = max(starts.values())
        outcome.checked_from = common
        for i, log in logs.items():
            for key, value, offset in clients.acked:
                if offset < starts[i]:
                    continue
                record = log.get(offset)
                event = decode_event(record[1]) if record is not None and record[1] is not None else None
                if record is None or record[0] != "kv/" + key or not isinstance(event, KvPut) \
                        or event.value != b"%d" % value or record[2] is False:
                    outcome.violations.append(f"node {i}: acknowledged write {key}={value} at offset {offset} "
                                              f"is not in its log (found {record!r:.120})")
            first = logs[1]
            diff = sorted(o for o in set(log) | set(first) if o >= common and log.get(o) != first.get(o))
            if diff:
                outcome.violations.append(f"node {i}'s kv log differs from node 1's at offsets {diff[:10]}")

    def _check_digests(self, cluster: NodeCluster, outcome: Outcome) -> None:
        """Stop the nodes once converged; every group's views must be equal on every node (the state
        of the compacted, truncated and pruned parts too)."""
        for group, nodes in cluster.stop_converged(GROUPS).items():
            if len(set(nodes.values())) != 1:
                outcome.violations.append(f"{group}: views differ after convergence: "
                                          + ", ".join(f"node {n} applied {a} digest {d.hex()[:12]}"
                                                      for n, (a, d) in sorted(nodes.items())))
            outcome.digests_equal += 1

    def _summary(self, o: Outcome) -> None:
        self.say("summary:")
        self.say(f"  faults: {dict(sorted(o.faults.items())) or 'none'}")
        self.say(f"  operations: {dict(sorted(o.ops.items()))}")
        self.say(f"  acknowledged writes: {o.acked_writes}; kv commit offset {o.commit}; "
                 + (f"converged {o.converged_s:.2f}s after healing" if o.converged_s >= 0 else "did not converge"))
        if self.p.compaction or self.p.short_retention:
            self.say(f"  compaction: kv logs compared from offset {o.checked_from}; views of {o.digests_equal} "
                     f"groups compared after stopping")
        self.say(f"  versions: {o.reads_checked} reads checked; log tail: {o.tail or 'none'}")
        if self.p.watch:
            self.say(f"  watch: {o.watch or 'not checked'}; final views of {o.views_compared} nodes compared")
        if o.inconclusive:
            self.say(f"  linearizability search inconclusive: {o.inconclusive}")
        for v in o.violations:
            self.say(f"VIOLATION {v}")
        verdict = {0: "OK", 1: "VIOLATIONS", 2: "INCONCLUSIVE"}[o.exit_code]
        self.say(f"chaos seed={self.p.seed}: {verdict}")


async def _read_log(client: AsyncClient, endpoint: str,
                    through: int) -> tuple[int, dict[int, tuple[str, bytes | None, bool | None]]]:
    """Node `endpoint`'s kv records from where it holds them as written through offset `through`:
    (that offset, offset -> (key, event bytes, applied)). Read again from the new start if the
    cleaner moves it meanwhile."""
    for _ in range(3):
        out: dict[int, tuple[str, bytes | None, bool | None]] = {}
        # Asked past its end, a node says where its log starts without refusing (one that just installed
        # a snapshot at `through` holds nothing as written through it, and would answer `compacted`).
        start = offset = (await client.read_events("kv", 1 << 62, max_events=1, endpoint=endpoint)).log_start
        try:
            while offset <= through:
                events = await client.read_events("kv", offset, max_events=1000, endpoint=endpoint)
                for r in events.events:
                    if r.offset <= through:
                        out[r.offset] = (r.key, r.value, r.applied)
                if events.next_offset <= offset:
                    raise AssertionError(f"{endpoint}: read_events made no progress at offset {offset} (commit "
                                         f"{events.commit_offset})")
                offset = events.next_offset
        except CompactedError:
            continue
        return start, out
    raise AssertionError(f"{endpoint}: the kv log start kept moving while it was read")


async def _history(client: AsyncClient, key: str, commit: int) -> tuple[int, dict[int, int | None]]:
    """`key`'s history on the node `client` talks to, at local consistency once it applied `commit`:
    (the history floor, offset -> value); changes below the floor are pruned."""
    out: dict[int, int | None] = {}
    after = -1
    floor = 0
    while True:
        changes = await client.history(key, limit=1000, after_offset=after, consistency="local", min_offset=commit)
        floor = max(floor, changes.floor)
        for ch in cast("list[Change]", changes):
            value = getattr(ch.state, "value", None)
            out[ch.offset] = None if value is None else int(value)
        if len(changes) < 1000:
            return floor, out
        after = changes[-1].offset
