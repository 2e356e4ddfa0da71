"""Seeds drawn while the suite is collected: a randomized test's id names its seed, so a failure says
how to replay it.

Under pytest-xdist (`make test` runs two workers) every worker collects the whole suite and they must
agree on every test id: the seeds then come from a generator seeded by the run's id
(PYTEST_XDIST_TESTRUNUID, the same in every worker of one run, new for each run), so every run still
draws fresh seeds. Without xdist they come from the system's source.
"""

from __future__ import annotations

import os
import random

RUN_ID_ENV = "PYTEST_XDIST_TESTRUNUID"


def collection_seeds(name: str, n: int, bits: int = 32) -> list[int]:
    """`n` seeds of `bits` bits for the parametrized test `name` (distinct names draw independently)."""
    run = os.environ.get(RUN_ID_ENV)
    rng = random.Random(f"{run}:{name}") if run else random.SystemRandom()
    return [rng.getrandbits(bits) for _ in range(n)]


SOAK_ENV = "EPOCHLOG_SOAK"


def _soak_scale() -> float:
    """EPOCHLOG_SOAK (default 1): how many times the suite's count a soak run draws."""
    return float(os.environ.get(SOAK_ENV) or 1)


def soak(n: int) -> int:
    """A randomized test's count of seeds or examples: `n` (the suite's default, sized so that a run of the
    whole suite fits its time bound; each run draws new ones) times EPOCHLOG_SOAK (default 1), for a
    longer soak run (`EPOCHLOG_SOAK=4 python -m pytest tests/sim`)."""
    return max(1, round(n * _soak_scale()))


def soak_seconds(seconds: float) -> float:
    """A time-bounded randomized test's duration (a fuzzer's): `seconds` times EPOCHLOG_SOAK."""
    return seconds * _soak_scale()
