"""CPU per event of applying committed writes (statemachines/apply.py), one process, two builds interleaved.

bench/build_ab.py measures whole clusters, whose figures move 10-15 % between runs on a loaded shared
machine; a change to the applier alone is measured better here: the process CPU time of
`ViewsStateMachine.apply` over the entries bench/vs_etcd's write cases make, built in memory. One
client session as bench/node_load.py's SDK client opens it: `--concurrency` writes in flight, each of
`--batch` KvPuts with consecutive sequences, `answered_below` the lowest sequence still in flight;
writes coalesced into entries of up to `--entry-bytes` (the leader's coalescing), one apply call per
entry (the Ready loop's slices). `--leader` adds what the kv leader spends on the same events before
proposing them (`events.event_record`'s check, or `checked_record` + `Applier.expect` in builds that
have it) and its batch encoding to the CPU measured, and hands each entry's records to the applier as the
leader's group does (`ViewsStateMachine.proposed`) in builds that have it; each entry is applied as soon as it
is built (the leader holds only what is in flight: the memos stay within their bounds). A build with views format
levels (statemachines/views_format.py) applies at its newest level, as a new cluster does.

    .venv/bin/python -m bench.apply_cost --base-rev main            # this checkout against main
    .venv/bin/python -m bench.apply_cost --base-rev main --batch 1 --concurrency 16

Each build runs in a fresh child process per round (`--rounds`, order alternating), with its own
source tree first on the path. Prints the median CPU us per event of each build and their ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys, tempfile, time
from eventlog.raft.types import Entry, EntryKind
from eventlog.records import encode_batch, stamp
from statemachines import events as ev
from statemachines.store import ViewsConfig
from statemachines.views import ViewsStateMachine
from bench.node_load import key_for, make_values

events_total, batch, conc, entry_bytes, leader = (int(x) for x in sys.argv[1:6])
keys = int(sys.argv[7])   # 0: every put to a new key; else puts cycle over this many keys (overwrites)
values = make_values()
sm = ViewsStateMachine(tempfile.mkdtemp(prefix="apply-cost-", dir=sys.argv[6]), ViewsConfig())
now = [1_700_000_000_000]

def entry(offset, records):
    now[0] += 1
    proposal = encode_batch(records, timestamp_ms=now[0])
    if hands_off:
        sm.proposed(offset, proposal, records)
    data = bytearray(proposal)
    stamp(data, offset, 1)
    return Entry(offset, 1, len(records), EntryKind.NORMAL, bytes(data))

hands_off = False   # set below, for the measured entries: `--leader` in builds whose applier takes them
opened = ev.ClientSessionOpened(group="kv", client="bench-client")
sm.apply([entry(0, [(opened.key().encode(), ev.encode_event(opened))])])
sid, offset, seq = 1, 1, 1
if hasattr(ev, "ViewsFormatRaised"):   # the newest views format, as a new cluster's first leader raises it
    from statemachines import views_format
    level = views_format.LATEST
    sm.apply([entry(1, [ev.event_record(ev.ViewsFormatRaised(level=level, v=level))])])
    offset = 2
calls, in_flight = [], []
for i in range(events_total // batch):
    seqs = list(range(seq, seq + batch))
    seq += batch
    in_flight.append(seqs[0])
    below = in_flight.pop(0) if len(in_flight) > conc else in_flight[0]
    calls.append([ev.KvPut(name=key_for((i * batch + j) % keys if keys else i * batch + j), value=values[(i * batch + j) % len(values)], session_id=sid,
                           seq=s, answered_below=below, v=ev.KvPut.VERSION) for j, s in enumerate(seqs)])
propose_once = hasattr(ev, "checked_record")


def proposed(call):
    if not leader:
        return [(e.key().encode(), ev.encode_event(e)) for e in call]
    if propose_once:
        checked = [ev.checked_record(e) for e in call]
        sm.expect(checked)
        return [(k, v) for k, v, _ in checked]
    return [ev.event_record(e) for e in call]


hands_off = bool(leader) and hasattr(sm, "proposed")
bad = 0
entries = []


def built(e):   # as the leader: each entry applied once built (what it proposed is held until then)
    global bad
    entries.append(e)
    if leader:
        bad += sum(1 for o in sm.apply([e]).values() if not o.ok)


t0 = time.process_time()
pending, size = [], 0
for call in calls:
    records = proposed(call)
    call_bytes = sum(len(k) + len(v) + 16 for k, v in records)
    if pending and size + call_bytes > entry_bytes:
        built(entry(offset, pending))
        offset += len(pending)
        pending, size = [], 0
    pending += records
    size += call_bytes
if pending:
    built(entry(offset, pending))
if not leader:
    t0 = time.process_time()
    for e in entries:
        bad += sum(1 for o in sm.apply([e]).values() if not o.ok)
cpu = time.process_time() - t0
events = sum(e.count for e in entries)
print(json.dumps({"events": events, "entries": len(entries), "rejected": bad, "cpu_s": cpu,
                  "us_per_event": 1e6 * cpu / events}))
"""


def export_rev(rev: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run(tree: Path, args: argparse.Namespace, scratch: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(args.events), str(args.batch), str(args.concurrency),
                          str(args.entry_bytes), str(int(args.leader)), str(scratch), str(args.keys)], cwd=tree, capture_output=True, text=True,
                         timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"apply_cost child in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, help="source tree of the build to compare with")
    ap.add_argument("--base-rev", help="git revision of the build to compare with (instead of --base)")
    ap.add_argument("--head", type=Path, default=ROOT, help="source tree of the other build (default: this one)")
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=100, help="KvPuts per write")
    ap.add_argument("--concurrency", type=int, default=16, help="writes in flight")
    ap.add_argument("--entry-bytes", type=int, default=64 << 10, help="entries coalesce writes up to this")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keys", type=int, default=0,
                    help="puts cycle over this many keys, each put after the first of a key an overwrite "
                         "(0: every put to a new key, as bench/node_load.py writes)")
    ap.add_argument("--leader", action="store_true", help="count the leader's check before proposing too")
    args = ap.parse_args()
    if (args.base is None) == (args.base_rev is None):
        ap.error("give one of --base and --base-rev")
    scratch = Path(tempfile.mkdtemp(prefix="apply-cost-"))
    try:
        builds = {"base": export_rev(args.base_rev, scratch / "base") if args.base_rev else args.base,
                  "head": args.head}
        got: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
        loads = []
        for r in range(args.rounds):
            for build in (("base", "head") if r % 2 == 0 else ("head", "base")):
                loads.append(Path("/proc/loadavg").read_text().split()[0])
                got[build].append(run(builds[build], args, scratch))
                print(f"round {r + 1} {build}: {json.dumps(got[build][-1])}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = {b: statistics.median(x["us_per_event"] for x in got[b]) for b in got}
    paired = sorted(h["us_per_event"] / b["us_per_event"] for b, h in zip(got["base"], got["head"]))
    print(f"{'leader: check + ' if args.leader else ''}"
          f"{f'{args.keys} keys, ' if args.keys else ''}batch {args.batch}, concurrency {args.concurrency}, entries up to {args.entry_bytes} bytes, "
          f"{args.events} events: base {med['base']:.1f} / head {med['head']:.1f} us CPU per event applied "
          f"({med['head'] / med['base']:.2f}x; per round {', '.join(f'{p:.2f}' for p in paired)}); "
          f"load average before each run {', '.join(loads)}")


if __name__ == "__main__":
    main()
