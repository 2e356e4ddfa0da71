"""The loop-only metrics (epochlog/metrics.py): what a scrape shows is what prometheus_client's own
`Histogram` and `Counter` show for the same observations, bucket by bucket."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Histogram

from epochlog.metrics import LoopCounter, LoopHistogram

BUCKETS = (0.0001, 0.00025, 0.001, 0.5, 1.0, 2.5)


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample but the `_created` timestamps (prometheus_client's own families have them)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in registry.collect() for s in family.samples if not s.name.endswith("_created")}


def test_a_loop_histogram_scrapes_as_a_prometheus_histogram(seed: int) -> None:
    rng = random.Random(seed)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopHistogram("x_seconds", "doc", "op", BUCKETS, registry=ours)
    reference = Histogram("x_seconds", "doc", ["op"], buckets=BUCKETS, registry=theirs)
    # Values on the bounds (`le`: a value equal to a bound is in its bucket), between them, above all.
    values = [*BUCKETS, 0.0, 3.0, 1e9] + [rng.choice((1e-5, 1e-3, 0.1, 2.0)) * rng.random() for _ in range(500)]
    for i, v in enumerate(values):
        op = ("write", "get")[i % 2]
        loop.labels(op).observe(v)
        reference.labels(op).observe(v)
    assert samples(ours) == samples(theirs)
    assert samples(ours)[("x_seconds_bucket", (("le", "0.001"), ("op", "write")))] > 0
    assert samples(ours)[("x_seconds_count", (("op", "get"),))] == len(values) // 2


def test_a_loop_counter_scrapes_as_a_prometheus_counter() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopCounter("x_bytes", "doc", "group", registry=ours)
    reference = Counter("x_bytes", "doc", ["group"], registry=theirs)
    for group, n in (("kv", 10), ("kv", 5), ("offsets", 7)):
        loop.labels(group).inc(n)
        reference.labels(group).inc(n)
    assert samples(ours) == samples(theirs) == {("x_bytes_total", (("group", "kv"),)): 15.0,
                                                ("x_bytes_total", (("group", "offsets"),)): 7.0}
