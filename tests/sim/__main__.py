"""The simulator campaign: `python -m tests.sim --seeds N [--start S] [--jobs J] [-v] [--views]`.

Runs seeds S .. S+N-1, prints one line per failing seed (the violated invariant and how to replay
it), then a summary line; exits 1 if any seed failed. `-v` prints each failure's parameters, fault
log and details (use it with --seeds 1 to replay one seed).
"""

from __future__ import annotations

import argparse
import os
import sys

from tests.sim.campaign import run_campaign


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=1000, help="how many seeds to run (default 1000)")
    ap.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: CPUs)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print parameters, fault log and details")
    ap.add_argument("--views", action="store_true",
                    help="every replica also keeps real RocksDB views; check their digests (views_shadow.py)")
    args = ap.parse_args(argv)
    summary = run_campaign(args.start, args.seeds, jobs=args.jobs, verbose=args.verbose, out=sys.stdout,
                           views=args.views)
    return 0 if summary.failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
