"""`python -m tests.chaos --seconds N --seed S`: one chaos run against three real nodes (see __init__)."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from tests.chaos.run import ChaosParams, ChaosRun


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos",
                                 description="Kill -9, SIGSTOP pauses and concurrent put/get/CAS against three "
                                             "real nodes; checks linearizability and every acknowledged write "
                                             "on every replica.")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long clients and nemesis run (default 30)")
    ap.add_argument("--seed", type=int, default=None, help="the run's seed (default: a random one, printed)")
    ap.add_argument("--clients", type=int, default=6, help="concurrent clients (default 6)")
    ap.add_argument("--keys", type=int, default=5, help="keys in the keyspace (default 5)")
    ap.add_argument("--dir", type=Path, default=None,
                    help="data directory to use and keep (default: a temporary one, deleted after a clean run)")
    ap.add_argument("--compaction", action="store_true",
                    help="snapshots every 200 offsets, 64 KiB segments, 300 offsets retained: truncation, key "
                         "compaction and pruning run throughout; the views are compared after stopping")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.clients < 1 or args.keys < 1:
        ap.error("--seconds, --clients and --keys must be positive")
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    params = ChaosParams(seconds=args.seconds, seed=seed, clients=args.clients, keys=args.keys,
                         compaction=args.compaction)
    try:
        return ChaosRun(params, args.dir).run().exit_code
    except (AssertionError, OSError) as exc:   # the cluster could not be set up or went away
        print(f"chaos seed={seed}: ERROR {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
