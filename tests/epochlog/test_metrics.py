"""The lockless metrics (epochlog/metrics.py): what a scrape shows is what prometheus_client's own
`Histogram` and `Counter` show for the same observations, bucket by bucket, whichever threads made them."""

from __future__ import annotations

import random
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from epochlog.metrics import LocklessCounter, LocklessHistogram

BUCKETS = (0.0001, 0.00025, 0.001, 0.5, 1.0, 2.5)


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample but the `_created` timestamps (prometheus_client's own families have them)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in registry.collect() for s in family.samples if not s.name.endswith("_created")}


def test_a_lockless_histogram_scrapes_as_a_prometheus_histogram(seed: int) -> None:
    rng = random.Random(seed)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    lockless = LocklessHistogram("x_seconds", "doc", "op", BUCKETS, registry=ours)
    reference = Histogram("x_seconds", "doc", ["op"], buckets=BUCKETS, registry=theirs)
    # Values on the bounds (`le`: a value equal to a bound is in its bucket), between them, above all.
    values = [*BUCKETS, 0.0, 3.0, 1e9] + [rng.choice((1e-5, 1e-3, 0.1, 2.0)) * rng.random() for _ in range(500)]
    for i, v in enumerate(values):
        reference.labels(("write", "get")[i % 2]).observe(v)

    def observe(part: int) -> None:   # each thread into counts of its own, merged when scraped
        for i, v in enumerate(values):
            if i % 3 == part:
                lockless.labels(("write", "get")[i % 2]).observe(v)
    threads = [threading.Thread(target=observe, args=(part,)) for part in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got, expected = samples(ours), samples(theirs)
    assert got.keys() == expected.keys()
    for key, value in expected.items():   # sums added in another order: equal to rounding
        assert got[key] == (pytest.approx(value, rel=1e-12) if key[0].endswith("_sum") else value), key
    assert samples(ours)[("x_seconds_bucket", (("le", "0.001"), ("op", "write")))] > 0
    assert samples(ours)[("x_seconds_count", (("op", "get"),))] == len(values) // 2


def test_a_lockless_counter_scrapes_as_a_prometheus_counter() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    lockless = LocklessCounter("x_bytes", "doc", "group", registry=ours)
    reference = Counter("x_bytes", "doc", ["group"], registry=theirs)
    for group, n in (("kv", 10), ("kv", 5), ("offsets", 7)):
        lockless.labels(group).inc(n)
        reference.labels(group).inc(n)
    assert samples(ours) == samples(theirs) == {("x_bytes_total", (("group", "kv"),)): 15.0,
                                                ("x_bytes_total", (("group", "offsets"),)): 7.0}
