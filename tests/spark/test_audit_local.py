"""The in-process audit engine (spark/audit_local.py) gives the Spark engine's answers, row for row.

A seeded table holds every kind of effect the questions handle, in three groups over several days:
kv puts (some attached to leases), deletes, transactions (kv, config and offset operations),
leases granted, revoked and expired, topics created and deleted, config set and removed, offsets
committed; each record applied, rejected (`applied` false) or unknown (null), by a few actors.
Both engines answer `state` at offsets of each group and at times (with and without prefixes),
`history` of keys, `diff` between times and `actions` of actors, on the latest table version and an
older one. Then the CLI: `epochlog audit` answers from this process by default (no JVM: it returns
in seconds) and takes keys as every command does (`app/x`).

Replay: EPOCHLOG_AUDIT_LOCAL_SEED=<seed printed>.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from spark.audit import Audit, Point, diff_rows
from spark.audit_local import LocalAudit, fits_local, table_rows
from spark.commit import DayFiles, commit_run
from spark.plan import ExportPlan
from spark.records import SourceRecord, to_batch
from spark.table import open_or_create, resolve
from statemachines import events as ev
from tests.support.nodes import ROOT

DAY_MS = 86_400_000
BASE_MS = 1_767_225_600_000   # 2026-01-01T00:00:00Z
ACTORS = ("alice", "bob", "")


def _seed() -> int:
    env = os.environ.get("EPOCHLOG_AUDIT_LOCAL_SEED")
    return int(env) if env else random.SystemRandom().getrandbits(16)


def _event(rng: random.Random, group: str, i: int, leases: list[int]) -> ev.Event:
    actor = rng.choice(ACTORS)
    name = f"k{rng.randrange(12)}"
    if group == "offsets":
        return ev.OffsetCommitted(consumer_group=f"cg{rng.randrange(2)}", topic="t", queue_id=rng.randrange(3),
                                  offset=i, actor=actor)
    if group == "metadata":
        roll = rng.random()
        if roll < 0.3:
            return ev.TopicCreated(name=f"t{rng.randrange(4)}", actor=actor)
        if roll < 0.45:
            return ev.TopicDeleted(name=f"t{rng.randrange(4)}", actor=actor)
        if roll < 0.8:
            return ev.ConfigChanged(scope="app", name=f"c{rng.randrange(4)}",
                                    value=None if rng.random() < 0.3 else f"x{i}", actor=actor)
        return ev.Txn(ops=(ev.ConfigChanged(scope="app", name=f"c{rng.randrange(4)}", value=f"t{i}"),   # type: ignore[arg-type]
                           ev.OffsetCommitted(consumer_group="cg9", topic="t", queue_id=0, offset=i)), actor=actor)
    roll = rng.random()
    if roll < 0.4:
        lease = rng.choice(leases) if leases and rng.random() < 0.3 else 0
        return ev.KvPut(name=name, value=b"v%d" % i if rng.random() < 0.9 else b"\xff\x00%d" % i, lease=lease,
                        actor=actor)
    if roll < 0.5:
        return ev.KvDeleted(name=name, actor=actor)
    if roll < 0.65:
        a, b = rng.sample(range(12), 2)
        return ev.Txn(ops=(ev.KvPut(name=f"k{a}", value=b"t%d" % i), ev.KvDeleted(name=f"k{b}")),  # type: ignore[arg-type]
                      conditions=(ev.Condition(f"kv/k{a}", 0),) if rng.random() < 0.3 else (), actor=actor)
    if roll < 0.75 or not leases:
        leases.append(len(leases) + 1)
        return ev.LeaseGranted(lease_id=leases[-1], ttl_ms=60_000, actor=actor)
    lease = rng.choice(leases)
    return ev.LeaseRevoked(lease_id=lease, actor=actor) if rng.random() < 0.5 else ev.LeaseExpired(lease_id=lease)


def _export(table: Path, rng: random.Random, starts: dict[str, int], n: int, day0: int) -> dict[str, int]:
    """Append n records per group (over three days from day0) as one commit; the next offset per group."""
    files = DayFiles(table)
    leases: list[int] = []
    for group, start in starts.items():
        records = []
        for i in range(start, start + n):
            event = _event(rng, group, i, leases)
            applied = rng.choices([True, False, None], [0.75, 0.15, 0.10])[0]
            ts = BASE_MS + day0 * DAY_MS + (i - start) * (3 * DAY_MS // n)
            records.append(SourceRecord(i, event.key(), ev.encode_event(event), ts, 1, applied))
        files.write(to_batch(group, records))
    plan = ExportPlan.make({g: s - 1 for g, s in starts.items()}, {g: (s, s + n - 1) for g, s in starts.items()})
    commit_run(table, files.close(), plan)
    return {g: s + n for g, s in starts.items()}


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


@pytest.mark.timeout(900)   # ~30 Spark jobs: minutes on a loaded machine
def test_the_local_engine_answers_as_spark_does(tmp_path: Path, spark_session: Any) -> None:
    seed = _seed()
    print(f"EPOCHLOG_AUDIT_LOCAL_SEED={seed}")
    rng = random.Random(seed)
    table = tmp_path / "events"
    open_or_create(table)
    ends = _export(table, rng, {"kv": 0, "metadata": 0, "offsets": 0}, 150, 0)
    older = resolve(table)
    ends = _export(table, rng, ends, 100, 3)
    latest = resolve(table)
    assert table_rows(latest) == 3 * 250 and fits_local(latest) and not fits_local(latest, max_rows=100)

    # Each comparison is a Spark job (seconds each on a loaded machine): a sample of every question on
    # the latest version, two on an older one.
    local, spark = LocalAudit(latest), Audit(spark_session, latest, use_checkpoints=False)
    checked = 0
    for group, prefixes in (("kv", ("", "kv/k1", "lease/")), ("metadata", ("topic/", "config/app/")),
                            ("offsets", ("offset/cg0/",))):
        for offset in (rng.randrange(ends[group]), ends[group] - 1):
            for prefix in prefixes:
                point = Point(group=group, offset=offset)
                want = spark.state(point, prefix)
                assert local.state(point, prefix) == want, f"seed {seed}: state {group}@{offset} {prefix!r}"
                checked += bool(want)
    a, b = sorted(BASE_MS + rng.randrange(6 * DAY_MS) for _ in range(2))
    at_time = []
    for ms in (a, b):
        point = Point(time=resolve_time(ms))
        want = spark.state(point, "")
        assert local.state(point, "") == want, f"seed {seed}: state at {_iso(ms)}"
        checked += bool(want)
        at_time.append(want)
    for key in ("kv/k0", "kv/k5", "config/app/c1", "topic/t2", "offset/cg9/t/0", "lease/00000000000000000001"):
        want = spark.history(key)
        assert local.history(key) == want, f"seed {seed}: history {key}"
        checked += bool(want)
    # Spark's diff is diff_rows of its two states (Audit.diff): those just asked, not two more Spark jobs.
    assert local.diff(Point(time=resolve_time(a)), Point(time=resolve_time(b)), "") == \
        diff_rows(*at_time), f"seed {seed}: diff"
    for actor, since, until, limit in (("alice", None, None, 1000), ("", resolve_time(a), resolve_time(b), 7)):
        want = spark.actions(actor, since=since, until=until, limit=limit)
        assert local.actions(actor, since=since, until=until, limit=limit) == want, f"seed {seed}: {actor!r}"
        checked += bool(want)
    assert checked > 15, "too few non-empty answers to compare"
    # Time travel: the older version answers as Spark reads that version.
    old_local, old_spark = LocalAudit(older), Audit(spark_session, older, use_checkpoints=False)
    assert old_local.state(Point(group="kv", offset=ends["kv"] - 1), "") == \
        old_spark.state(Point(group="kv", offset=ends["kv"] - 1), ""), f"seed {seed}: old state"
    assert old_local.history("kv/k3") == old_spark.history("kv/k3"), f"seed {seed}: old history"


def resolve_time(ms: int) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _epochlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epochlog", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def test_the_cli_answers_a_small_table_in_process_with_user_keys(tmp_path: Path) -> None:
    table = tmp_path / "events"
    open_or_create(table)
    files = DayFiles(table)
    events = [ev.KvPut(name="app/x", value=b"1", actor="alice"), ev.KvPut(name="app/y", value=b"2"),
              ev.KvPut(name="app/x", value=b"3", actor="alice"), ev.KvDeleted(name="app/y")]
    files.write(to_batch("kv", [SourceRecord(i, e.key(), ev.encode_event(e), BASE_MS + i, 1, True)
                                for i, e in enumerate(events)]))
    commit_run(table, files.close(), ExportPlan.make({}, {"kv": (0, 3)}))

    started = time.monotonic()
    history = _epochlog("audit", "history", "app/x", "--table", str(table), "--json")
    state = _epochlog("audit", "state", "--table", str(table), "--offset", "2", "--prefix", "app/", "--json")
    took = time.monotonic() - started
    assert history.returncode == 0 and state.returncode == 0, (history.stderr, state.stderr)
    assert [(r["offset"], r["value"]) for r in json.loads(history.stdout)] == [(0, "1"), (2, "3")]
    assert [(r["key"], r["value"]) for r in json.loads(state.stdout)] == [("app/x", "3"), ("app/y", "2")]
    assert "asking Spark" not in history.stderr + state.stderr
    print(f"two audit answers from the CLI in {took:.1f} s")   # no bound: "asking Spark" above says in process
    refused = _epochlog("audit", "history", "kv/app/x", "--table", str(table))
    assert refused.returncode == 3 and "'app/x'" in refused.stderr
