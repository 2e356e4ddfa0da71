"""Property test of key compaction against a model, seeded and replayable.

Each seed builds a random log of keyed records (tombstones, null keys, control and gzip batches,
epochs, keys longer than 16 bytes) in small segments, then alternates appends and cleaning passes at
random horizons with a random offset-map capacity (so some passes stop when the map fills), forced
or subject to the dirty ratio. After every pass that did something, and again through a reopened
log (and once with the leader-epoch checkpoint deleted, so it is rebuilt from the batches):

- the records are exactly the model's (`logs.expected`): below the offset the pass mapped up to,
  each key's latest record only; everything else as written; every offset and value unchanged;
- with a zero tombstone retention, a record may also be missing only if it is a tombstone that was
  its key's latest below that offset (an expired delete);
- reads from random offsets (`Log.batches(o)`) give the model's records from `o` on;
- every kept record's epoch is the one that wrote it, and `end_offset_for_epoch` answers as before;
- `verify_log_dir` finds the directory clean.

Replay: EPOCHLOG_CLEANER_SEED=<seed> (the failing seed is printed); more seeds: EPOCHLOG_CLEANER_SEEDS=<n>
(6 by default) or EPOCHLOG_SOAK=<k> (k times as many).
"""

from __future__ import annotations

import os
import random

import pytest

from compaction.cleaner import clean_log
from compaction.config import CleanerConfig
from eventlog.config import LogConfig
from eventlog.epoch_cache import CHECKPOINT_NAME as EPOCH_CHECKPOINT
from eventlog.log import Log
from eventlog.offline import Verdict, verify_log_dir
from tests.support.seeds import collection_seeds, soak
from tests.compaction.logs import Written, expected, records, triples, write_random

SEEDS = int(os.environ.get("EPOCHLOG_CLEANER_SEEDS") or soak(6))   # 10 before the suite's time bound
_FIXED = os.environ.get("EPOCHLOG_CLEANER_SEED")
SEED_LIST = [int(_FIXED)] if _FIXED else collection_seeds("test_cleaned_log_matches_model", SEEDS)


def check(log: Log, written: list[Written], mapped_end: int, tombstones_may_expire: bool, ctx: str,
          rng: random.Random, epochs_before: dict[int, tuple[int, int] | None]) -> None:
    model = expected(written, mapped_end)
    actual = records(log)
    if not tombstones_may_expire:
        assert actual == triples(model), f"{ctx}: first difference {_first_diff(actual, triples(model))}"
    else:
        present = set(actual)
        assert present <= set(triples(model)), f"{ctx}: records the model dropped: {sorted(present - set(triples(model)))[:5]}"
        for w in model:
            if (w.offset, w.key, w.value) not in present:
                assert w.offset < mapped_end and w.value is None and w.key is not None, (
                    f"{ctx}: record {w} is missing but is no expired tombstone")
        model = [w for w in model if (w.offset, w.key, w.value) in present]
    for _ in range(5):
        o = rng.randrange(log.start_offset, log.end_offset + 1)
        assert records(log, o) == [t for t in triples(model) if t[0] >= o], f"{ctx}: read from offset {o}"
    by_offset = {w.offset: w for w in written}
    for offset, _, _ in actual:
        assert log.epoch_for_offset(offset) == by_offset[offset].epoch, f"{ctx}: epoch of offset {offset}"
    for epoch, answer in epochs_before.items():
        assert log.end_offset_for_epoch(epoch) == answer, f"{ctx}: end offset for epoch {epoch}"


def _first_diff(a: list, b: list) -> object:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i, x, y
    return len(a), a[len(b):len(b) + 2], b[len(a):len(a) + 2]


@pytest.mark.parametrize("seed", SEED_LIST)
def test_cleaned_log_matches_model(tmp_path, seed):
    print(f"EPOCHLOG_CLEANER_SEED={seed}")
    rng = random.Random(seed)
    config = LogConfig(segment_bytes=rng.choice([2048, 4096, 8192]), index_interval_bytes=rng.choice([128, 512]),
                       flush_policy="fsync", preallocate_next_segment=False)
    path = tmp_path / "log"
    expire = rng.random() < 0.4
    cleaner = CleanerConfig(offset_map_max_keys=rng.choice([8, 40, 10_000]), delete_retention_ms=0 if expire else 10**15,
                            min_cleanable_dirty_ratio=rng.choice([0.0, 0.5]), worker_process=False)
    log = Log.open(path, config)
    try:
        written = write_random(log, rng, rng.randrange(150, 400), key_space=rng.choice([5, 30, 200]))
        mapped_end = log.start_offset
        for round_ in range(rng.randrange(3, 7)):
            epochs_before = {e: log.end_offset_for_epoch(e) for e, _ in log.epoch_entries}
            horizon = rng.randrange(log.start_offset, log.end_offset + 1)
            result = clean_log(log, horizon, cleaner, force=rng.random() < 0.5)
            ctx = f"seed {seed} round {round_} clean below {horizon}: {result}"
            if result.skipped is None:
                assert result.aborted is None, ctx
                assert result.dirty_offset <= horizon, ctx
                mapped_end = max(mapped_end, result.dirty_offset)
                assert result.records_kept + result.records_dropped == result.records_read, ctx
            check(log, written, mapped_end, expire, ctx, rng, epochs_before)
            written += write_random(log, rng, rng.randrange(0, 120), key_space=30,
                                    start_ts=(written[-1].timestamp if written else 0) + 1)
        epochs_before = {e: log.end_offset_for_epoch(e) for e, _ in log.epoch_entries}
        before = records(log)
        log.close()
        assert verify_log_dir(path).verdict is Verdict.CLEAN, verify_log_dir(path).problems
        log = Log.open(path, config)
        assert records(log) == before, f"seed {seed}: reads differ after reopening"
        check(log, written, mapped_end, expire, f"seed {seed} reopened", rng, epochs_before)
        log.close()
        (path / EPOCH_CHECKPOINT).unlink()
        log = Log.open(path, config)
        assert log.recovery is not None and log.recovery.segments_scanned == len(log.segment_bases())
        assert records(log) == before, f"seed {seed}: reads differ after rebuilding the epoch checkpoint"
        for offset, _, _ in before:
            assert log.epoch_for_offset(offset) == next(w.epoch for w in written if w.offset == offset)
    finally:
        log.close()
