"""Tables shaped for audit questions: typed payload columns, files clustered by key, state checkpoints.

The tables of 2. and 3. are written by tests/spark/plain_export.py (the Spark writer's files and commit
without a Spark job; the exporter has tests of its own); 1. exports through Spark.

1. Typed columns: each event's value, lease, expected version, broker name and epoch; a table made
   before they existed gets them on the next export (older rows: null) and stays readable by deltalake
   and polars.
2. Clustering: export files span every key (history reads them all, state at an offset skips the
   files past it); after `optimize(cluster=True)` the answers of `history` and `state --prefix` are the
   same as before (and as with every file read), and they read a fraction of the files (counted).
3. State checkpoints: a history of puts, deletes, transactions, leases granted, attached and revoked,
   config changes; checkpoints every K offsets; `state` at offsets below, at, between and above the
   checkpoints (with and without a prefix) equals the full replay (the in-process engine's; Spark's
   own at the time-travel point) and starts from the nearest checkpoint; a table version whose
   watermark is below a checkpoint does not use it.

Replay: EPOCHLOG_LAYOUT_SEED=<seed printed>.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from spark.audit import Audit, Point
from spark.audit_local import LocalAudit
from spark.checkpoints import checkpoints, make_checkpoints, plan_checkpoints
from spark.export import export_once
from spark.maintenance import optimize_table, table_files
from spark.records import SourceRecord, to_batch
from spark.sources import OfflineSource
from spark.storage import TableLocation
from tests.spark.plain_export import plain_export
from tests.spark.synthetic import BASE_TIMESTAMP_MS, write_events, write_group
from spark.table import FILE_SCHEMA, PARTITION_COLUMN, TYPED_COLUMNS, open_or_create, open_table, resolve
from statemachines import events as ev


def _seed() -> int:
    env = os.environ.get("EPOCHLOG_LAYOUT_SEED")
    return int(env) if env else random.SystemRandom().getrandbits(16)


def test_typed_columns_carry_the_common_payload_fields() -> None:
    events = [ev.KvPut(name="a", value=b"\x00v", lease=7, expected_version=3), ev.KvDeleted(name="a", expected_version=9),
              ev.LeaseRevoked(lease_id=7), ev.ConfigChanged(scope="s", name="n", value="on"),
              ev.BrokerFenced(cluster="c", group="g", name="broker-a", broker_epoch=5),
              ev.MasterElected(cluster="c", group="g", master=1, master_epoch=4), ev.HistoryPruned(floor=3)]
    records = [SourceRecord(i, e.key(), ev.encode_event(e), BASE_TIMESTAMP_MS, 1, True) for i, e in enumerate(events)]
    rows = to_batch("metadata", records).to_pylist()
    typed = [tuple(r[c] for c in TYPED_COLUMNS) for r in rows]
    assert typed == [(b"\x00v", 7, 3, None, None), (None, None, 9, None, None), (None, 7, None, None, None),
                     (b"on", None, None, None, None), (None, None, None, "broker-a", 5), (None, None, None, None, 4),
                     (None, None, None, None, None)]


def test_an_older_table_gets_the_typed_columns_and_stays_readable(tmp_path: Path, spark_session: Any) -> None:
    import polars as pl
    from deltalake import DeltaTable

    data, table = tmp_path / "node", tmp_path / "events"
    old_schema = FILE_SCHEMA.append(FILE_SCHEMA.field("offset").with_name(PARTITION_COLUMN).with_type(
        FILE_SCHEMA.field("group").type))
    old_schema = old_schema.remove(old_schema.get_field_index("value"))
    for name in ("lease", "expected_version", "broker_name", "epoch"):
        old_schema = old_schema.remove(old_schema.get_field_index(name))
    DeltaTable.create(str(table), old_schema, partition_by=[PARTITION_COLUMN])
    write_group(data, "kv", 300, batch_records=30, keys=20, seed=1)
    run = export_once(spark_session, table, OfflineSource.discover(data))
    assert run.table_version == 2   # version 1 added the columns
    names = [f.name for f in open_table(table).schema().fields]
    assert all(n in names for n in TYPED_COLUMNS)
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    assert len(rows) == 300 and all(r["value"] is not None for r in rows if r["event_type"] == "KvPut")
    frame = pl.read_delta(str(table))
    assert frame.height == 300 and frame.filter(pl.col("event_type") == "KvPut")["value"].null_count() == 0


def test_clustering_by_key_reads_a_fraction_of_the_files_same_answers(tmp_path: Path, spark_session: Any) -> None:
    seed = _seed()
    print(f"EPOCHLOG_LAYOUT_SEED={seed}")
    data, table = tmp_path / "node", tmp_path / "events"
    (data / "groups" / "kv" / "log").mkdir(parents=True)
    source = OfflineSource.discover(data)
    for run in range(4):   # four runs: four files in the one day partition, each spanning every key
        write_group(data, "kv", 15_000, batch_records=500, keys=3000, seed=seed + run, segment_bytes=4 << 20,
                    timestamp_ms=BASE_TIMESTAMP_MS + run * 60_000, ms_per_event=1)
        plain_export(table, source)
    key, prefix, mid = "kv/k/00000042", "kv/k/000001", 30_000

    def ask(audit: Audit) -> tuple[list[Any], int, list[Any], int]:
        history = audit.history(key)
        h_files = audit.files_read
        state = audit.state(Point(group="kv", offset=mid), prefix)
        return history, h_files, state, audit.files_read

    before = ask(Audit(spark_session, resolve(table)))
    files_before = table_files(table).files
    # Export files hold every key (history reads them all) and a range of offsets (state at the middle
    # offset skips the runs after it).
    assert (before[1], before[3], files_before) == (4, 2, 4)
    result = optimize_table(table, target_file_bytes=1 << 20, cluster=True)
    files_after = table_files(table).files
    assert files_after >= 8, (result, files_after)
    after = ask(Audit(spark_session, resolve(table)))
    full = ask(Audit(spark_session, resolve(table), prune=False))
    assert after[0] == before[0] == full[0] and after[2] == before[2] == full[2], "answers changed"
    assert len(after[0]) > 10 and len(after[2]) > 10
    print(f"files read: history {before[1]}/{files_before} -> {after[1]}/{files_after}, "
          f"state --prefix {before[3]}/{files_before} -> {after[3]}/{files_after}")
    assert after[1] <= 2 and after[3] <= 3 and full[1] == full[3] == files_after
    assert after[1] / files_after < before[1] / files_before


def _history(rng: random.Random, n: int) -> list[tuple[int, ev.Event]]:
    """A seeded mix of every kind of effect the state query handles."""
    out: list[tuple[int, ev.Event]] = []
    leases: list[int] = []
    next_lease = 1
    for i in range(n):
        ts = BASE_TIMESTAMP_MS + i * 1000
        name = f"k{rng.randrange(25)}"
        roll = rng.random()
        if roll < 0.45:
            lease = rng.choice(leases) if leases and rng.random() < 0.3 else 0
            out.append((ts, ev.KvPut(name=name, value=b"v%d" % i, lease=lease)))
        elif roll < 0.55:
            out.append((ts, ev.KvDeleted(name=name)))
        elif roll < 0.65:
            a, b = rng.sample(range(25), 2)   # a transaction touches each key once
            ops = [ev.KvPut(name=f"k{a}", value=b"t%d" % i), ev.KvDeleted(name=f"k{b}")]
            out.append((ts, ev.Txn(ops=tuple(ops))))
        elif roll < 0.72:
            leases.append(next_lease)
            out.append((ts, ev.LeaseGranted(lease_id=next_lease, ttl_ms=60_000)))
            next_lease += 1
        elif roll < 0.80 and leases:
            lease = leases.pop(rng.randrange(len(leases)))
            out.append((ts, ev.LeaseRevoked(lease_id=lease) if rng.random() < 0.5 else ev.LeaseExpired(lease_id=lease)))
        else:
            out.append((ts, ev.ConfigChanged(scope="app", name=f"c{rng.randrange(5)}",
                                             value=None if rng.random() < 0.3 else f"x{i}")))
    return out


def test_state_from_checkpoints_equals_the_full_replay(tmp_path: Path, spark_session: Any) -> None:
    seed = _seed()
    print(f"EPOCHLOG_LAYOUT_SEED={seed}")
    rng = random.Random(seed)
    data, table = tmp_path / "node", tmp_path / "events"
    loc = TableLocation.parse(table)
    offsets = write_events(data, "kv", _history(rng, 400))
    plain_export(table, OfflineSource.discover(data))
    first_version = open_table(table).version()
    more = write_events(data, "kv", _history(rng, 200))
    plain_export(table, OfflineSource.discover(data))
    assert plan_checkpoints({}, {"kv": more[-1]}, 150) == [("kv", c) for c in range(150, more[-1] + 1, 150)]

    made = make_checkpoints(spark_session, loc, 150)
    assert [(g, o) for g, o, _ in made] == [("kv", c) for c in range(150, more[-1] + 1, 150)]
    assert sorted(checkpoints(loc)["kv"]) == [o for _, o, _ in made]
    assert make_checkpoints(spark_session, loc, 150) == []   # nothing missing
    assert open_or_create(table).version() == open_table(table).version()   # the side table is apart

    # The full replay to compare with: the in-process engine (it never uses checkpoints, and
    # tests/spark/test_audit_local.py holds its answers to Spark's), one Spark job per question fewer;
    # Spark's own replay (use_checkpoints=False) is compared at the time-travel point below.
    latest = resolve(table)
    fast, full = Audit(spark_session, latest), LocalAudit(latest)
    points = sorted({149, 150, 151, 300 + rng.randrange(150), more[-1], more[-1] + 50, rng.randrange(more[-1])})
    for prefix in ("", "kv/k1"):
        for n in points:
            got = fast.state(Point(group="kv", offset=n), prefix)
            assert got == full.state(Point(group="kv", offset=n), prefix), f"seed {seed}, offset {n}, prefix {prefix!r}"
            want_ckpt = max((c for _, c, _ in made if c <= n), default=None)
            assert fast.checkpoint_used == want_ckpt, (n, fast.checkpoint_used)
    # Time travel: the first version's watermark is below the later checkpoints; they are not used.
    old = resolve(table, version=first_version)
    audit, slow = Audit(spark_session, old), Audit(spark_session, old, use_checkpoints=False)
    got = audit.state(Point(group="kv", offset=more[-1]), "")
    assert audit.checkpoint_used is not None and audit.checkpoint_used <= offsets[-1]
    assert got == slow.state(Point(group="kv", offset=more[-1]), "") == LocalAudit(old).state(
        Point(group="kv", offset=more[-1]), ""), f"seed {seed}"
    assert slow.checkpoint_used is None
