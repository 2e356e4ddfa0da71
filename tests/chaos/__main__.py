"""`python -m tests.chaos --seconds N --seed S`: one chaos run against three real nodes (see __init__)."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from tests.chaos.run import OP_TIMEOUT_S, ChaosParams, ChaosRun


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos",
                                 description="Kill -9, SIGSTOP pauses (and with --partitions, cut peer links) "
                                             "under concurrent put/get/CAS against three real nodes; checks "
                                             "linearizability, every read's version and every acknowledged write "
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
    ap.add_argument("--short-retention", action="store_true",
                    help="--compaction with 150 offsets retained and snapshots every 100: the history floor (and "
                         "the window of request-id deduplication) stays 150 offsets behind, and members back from "
                         "a fault catch up by snapshot")
    ap.add_argument("--partitions", action="store_true",
                    help="the nemesis also isolates leaders and followers from their peers (client ports stay "
                         "reachable) and cuts peer links one way, through frame-aware proxies between the nodes "
                         "(tests/support/proxy.py; no iptables, no root)")
    ap.add_argument("--watch", action="store_true",
                    help="a watch consumer replays the chaos keys; its replay must equal every node's final views")
    ap.add_argument("--op-timeout", type=float, default=OP_TIMEOUT_S,
                    help=f"each client call's timeout in seconds (default {OP_TIMEOUT_S:g})")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.clients < 1 or args.keys < 1 or args.op_timeout <= 0:
        ap.error("--seconds, --clients, --keys and --op-timeout must be positive")
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    params = ChaosParams(seconds=args.seconds, seed=seed, clients=args.clients, keys=args.keys,
                         op_timeout_s=args.op_timeout, compaction=args.compaction,
                         short_retention=args.short_retention, partitions=args.partitions, watch=args.watch)
    try:
        return ChaosRun(params, args.dir).run().exit_code
    except (AssertionError, OSError) as exc:   # the cluster could not be set up or went away
        print(f"chaos seed={seed}: ERROR {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
