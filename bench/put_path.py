"""The path of one put through a 3-node cluster, hop by hop: where a single client's latency goes.

A 3-node cluster (as bench/vs_etcd makes one: peer TLS, plaintext client face, leaders spread) whose
nodes load bench/put_path_hooks/sitecustomize.py: a few methods (the client face's and the peer
transport's reads and writes, the group task's inbox step and Ready handling, `Node.start_write`, the views'
apply, the log segment's write and fdatasync) note `time.monotonic_ns()` as they run, one clock for
every process. One SDK client in this process makes `--puts` puts one at a time, `--gap-ms` apart (so
one put's hops do not overlap the next one's), and notes when each `put()` started and returned. Each
put's marks are then read off the three nodes within its window: the leader's, the follower whose
acknowledgement came first (the one that commits), and the leader again until its reply.

    .venv/bin/python -m bench.put_path                 # 1,000 puts; prints the table
    .venv/bin/python -m bench.put_path --puts 2000 --write

The wrappers cost each process a few microseconds per mark (about twenty marks per put), so the
end-to-end figure is a little above an untraced run's: read the hops' shares. The machine should be
idle; the load average before and after is printed with the table. Not a pass/fail test: the numbers
are for deciding what to work on (bench/RESULTS.md issue-20-where-now).

With `--steps` the nodes also mark the steps inside the hops (the peer checks, the core's step, ready
and advance, proposing, the log append and its sync's bookkeeping, the apply's parts, the RocksDB
write, the runner, ...: `_STEPS` in the hooks), and two more tables follow: for the leader and for the
follower that acknowledged first, the time from each mark to the next, per pair of marks.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.node_load import key_for, make_values
from bench.paired_ab import start
from bench.results import write_section

ROOT = Path(__file__).resolve().parents[1]
HOOKS = Path(__file__).with_name("put_path_hooks")


@dataclass
class Marks:
    """One process's marks, in time order (as it noted them)."""

    times: list[int]
    tags: list[str]

    @classmethod
    def read(cls, path: Path) -> Marks:
        rows = [line.split(" ", 1) for line in path.read_text().splitlines() if line]
        return cls([int(t) for t, _ in rows], [tag for _, tag in rows])

    def first(self, tag: str, after: int, before: int) -> int | None:
        """The time of the first mark `tag` (or `tag:<size>`) in [after, before], or None."""
        i = bisect.bisect_left(self.times, after)
        while i < len(self.times) and self.times[i] <= before:
            t = self.tags[i]
            if t == tag or t.startswith(tag + ":"):
                return self.times[i]
            i += 1
        return None

    def count(self, tag: str) -> int:
        return sum(1 for t in self.tags if t == tag)

    def between(self, after: int, before: int) -> list[tuple[int, str]]:
        """(time, tag without its size) of every mark in [after, before], in order."""
        i = bisect.bisect_left(self.times, after)
        out = []
        while i < len(self.times) and self.times[i] <= before:
            out.append((self.times[i], self.tags[i].partition(":")[0]))
            i += 1
        return out


@dataclass
class Steps:
    """The time between consecutive marks of one process, per pair of marks (the n-th such pair of a put
    counted apart), over the puts: `--steps`' tables."""

    gaps: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    places: dict[tuple[str, int], list[int]] = field(default_factory=dict)

    def add(self, marks: list[tuple[int, str]]) -> None:
        seen: dict[str, int] = {}
        for place, ((t0, a), (t1, b)) in enumerate(zip(marks, marks[1:])):
            pair = f"{a} -> {b}"
            key = (pair, seen.get(pair, 0))
            seen[pair] = key[1] + 1
            self.gaps.setdefault(key, []).append((t1 - t0) / 1000)
            self.places.setdefault(key, []).append(place)

    def table(self, puts: int) -> str:
        """The pairs seen in at least half the puts, in the order they usually come."""
        rows = ["| step (mark -> next mark) | puts | p50 us | p90 us |", "|---|---:|---:|---:|"]
        kept = [k for k, v in self.gaps.items() if len(v) * 2 >= puts]
        for key in sorted(kept, key=lambda k: statistics.median(self.places[k])):
            v = sorted(self.gaps[key])
            rows.append(f"| {key[0]} | {len(v)} | {statistics.median(v):,.1f} | {v[int(len(v) * 0.9)]:,.1f} |")
        return "\n".join(rows)


def steps(puts: Sequence[tuple[int, int]], marks: dict[int, Marks]) -> tuple[str, str]:
    """Step tables (with `--steps`' marks): the leader's, from reading the request to writing the reply;
    the follower's whose acknowledgement came first, from reading the append to writing that acknowledgement."""
    leader = max(marks, key=lambda pid: marks[pid].count("client_in"))
    lead, follow = Steps(), Steps()
    for t0, t1 in puts:
        seq = marks[leader].between(t0, t1)
        tags = [tag for _, tag in seq]
        if "client_in" not in tags or "reply_out" not in tags or "peer_out" not in tags:
            continue
        last = len(tags) - 1 - tags[::-1].index("reply_out")
        lead.add(seq[tags.index("client_in"):last + 1])
        append = seq[tags.index("peer_out")][0]
        acked: list[list[tuple[int, str]]] = []
        for pid in marks:
            if pid == leader:
                continue
            theirs = marks[pid].between(append, t1)
            names = [tag for _, tag in theirs]
            if "peer_in" in names and "peer_out" in names[names.index("peer_in"):]:
                start = names.index("peer_in")
                acked.append(theirs[start:start + names[start:].index("peer_out") + 1])
        if acked:
            follow.add(min(acked, key=lambda s: s[-1][0]))
    return lead.table(len(puts)), follow.table(len(puts))


@dataclass
class Hops:
    """Each hop's durations (us) over the puts whose every mark was found."""

    order: list[str] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, start: int, end: int) -> None:
        if name not in self.values:
            self.order.append(name)
            self.values[name] = []
        self.values[name].append((end - start) / 1000)

    def table(self) -> str:
        rows = ["| hop | puts | p50 us | p90 us |", "|---|---:|---:|---:|"]
        for name in self.order:
            v = sorted(self.values[name])
            rows.append(f"| {name} | {len(v)} | {statistics.median(v):,.0f} | {v[int(len(v) * 0.9)]:,.0f} |")
        return "\n".join(rows)


def trace(puts: Sequence[tuple[int, int]], marks: dict[int, Marks]) -> tuple[Hops, int]:
    """The hops of each put (client start and end times) found in the nodes' marks; and how many puts
    could not be traced whole (a mark missing in its window, e.g. a put whose commit came with the next)."""
    leader = max(marks, key=lambda pid: marks[pid].count("client_in"))
    followers = [pid for pid in marks if pid != leader]
    lead = marks[leader]
    hops = Hops()
    untraced = 0
    for t0, t1 in puts:
        found = _one_put(lead, [marks[f] for f in followers], t0, t1)
        if found is None:
            untraced += 1
            continue
        for name, a, b in found:
            hops.add(name, a, b)
    return hops, untraced


def _sequence(marks: Marks, tags: Sequence[str], after: int, before: int) -> list[int] | None:
    """The times of `tags` in [after, before], each the first one after the one before it; None when one
    is missing."""
    times = []
    for tag in tags:
        t = marks.first(tag, after, before)
        if t is None:
            return None
        times.append(t)
        after = t
    return times


def _one_put(lead: Marks, followers: list[Marks], t0: int, t1: int) -> list[tuple[str, int, int]] | None:
    sent = _sequence(lead, ("client_in", "node_write", "step", "handle", "peer_out", "log_write", "sync", "sync_end"),
                     t0, t1)
    if sent is None:
        return None
    got, write, turn, handle, append, _, own_sync, own_synced = sent
    acked = [times for f in followers if (times := _sequence(
        f, ("peer_in", "step", "step_end", "handle", "log_write", "sync", "sync_end", "peer_out"), append, t1))]
    if not acked:
        return None
    read, f_step, f_step_end, f_handle, f_write, f_sync, f_synced, ack = min(acked, key=lambda times: times[-1])
    answered = _sequence(lead, ("peer_in", "step", "apply", "reply_out"), ack, t1)
    if answered is None:
        return None
    ack_read, _, applying, reply = answered
    return [
        ("client: `put()` -> the leader's face reads the request", t0, got),
        ("leader: request read -> `Node.start_write`", got, write),
        ("leader: `Node.start_write` -> the group's turn", write, turn),
        ("leader: turn -> its Ready (proposals, `ready()`)", turn, handle),
        ("leader: Ready -> Append written", handle, append),
        ("Append written -> the follower reads it", append, read),
        ("follower: read -> its turn (wake-up, decode)", read, f_step),
        ("follower: inbox step (peer checks, the core's step)", f_step, f_step_end),
        ("follower: step -> its Ready (`ready()`)", f_step_end, f_handle),
        ("follower: Ready -> its log write", f_handle, f_write),
        ("follower: log write -> fdatasync", f_write, f_sync),
        ("follower: fdatasync", f_sync, f_synced),
        ("follower: synced -> acknowledgement written", f_synced, ack),
        ("ack written -> the leader reads it", ack, ack_read),
        ("leader: ack read -> apply (wake-up, step, commit)", ack_read, applying),
        ("leader: apply starts -> reply written (the write told, its reply encoded; a prepared entry's batch is"
         " written after)", applying, reply),
        ("client: reply written -> `put()` returns", reply, t1),
        ("(off the path) leader: Append written -> its own fdatasync", append, own_sync),
        ("(off the path) leader: its own fdatasync", own_sync, own_synced),
        ("end to end", t0, t1),
    ]


async def drive(endpoints: list[str], puts: int, gap_s: float) -> list[tuple[int, int]]:
    from epochlog.client import AsyncClient

    values = make_values()
    client = AsyncClient(endpoints, timeout=10)
    try:
        for i in range(300):   # sessions opened, connections made, caches warm
            await client.put(key_for(i), values[i % len(values)])
        windows = []
        for i in range(puts):
            t0 = time.monotonic_ns()
            await client.put(key_for(1_000_000 + i), values[i % len(values)])
            windows.append((t0, time.monotonic_ns()))
            await asyncio.sleep(gap_s)
        return windows
    finally:
        await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--puts", type=int, default=1000)
    ap.add_argument("--gap-ms", type=float, default=2.0, help="pause after each put")
    ap.add_argument("--steps", action="store_true",
                    help="mark the steps inside the hops too, and print the leader's and the follower's steps")
    ap.add_argument("--write", action="store_true", help="write section put-path of bench/RESULTS.md")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="put-path-"))
    marks_dir = scratch / "marks"
    marks_dir.mkdir()
    os.environ["PUT_PATH_DIR"] = str(marks_dir)   # for the nodes started below, which inherit it
    if args.steps:
        os.environ["PUT_PATH_STEPS"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOKS), os.environ.get("PYTHONPATH")) if p)
    load_before = os.getloadavg()[0]
    try:
        cluster = start(ROOT, scratch / "data")
        try:
            windows = asyncio.run(drive(cluster.endpoints, args.puts, args.gap_ms / 1000))
            time.sleep(1.2)   # the nodes' last marks reach their files
            pids = list(cluster.pids)
        finally:
            cluster.stop()
        missing = sorted({line for pid in pids for line in (marks_dir / f"{pid}.missing").read_text().splitlines()})
        if missing:
            raise SystemExit(f"the hooks could not wrap {', '.join(missing)}: update bench/put_path_hooks")
        marks = {pid: Marks.read(marks_dir / f"{pid}.marks") for pid in pids}
        hops, untraced = trace(windows, marks)
        step_tables = steps(windows, marks) if args.steps else None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    body = (f"{hops.table()}\n\n{args.puts} puts one at a time, {args.gap_ms:g} ms apart, after 300 warm-up puts; "
            f"{untraced} not traced whole. Load average (1 min) {load_before:.2f} before, "
            f"{os.getloadavg()[0]:.2f} after.")
    if step_tables is not None:
        body += (f"\n\nThe leader's steps, from reading the request to writing the reply (with the steps' own "
                 f"marks, ~1 us each):\n\n{step_tables[0]}\n\nThe follower's whose acknowledgement came first, "
                 f"from reading the append to writing it:\n\n{step_tables[1]}")
    print(body)
    if args.write:
        write_section("put-path", body)


if __name__ == "__main__":
    main()
