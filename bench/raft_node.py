"""A node of raw Raft groups, for bench/raft_bench.py: the Raft runtime without the Epochlog node above it.

    python -m bench.raft_node serve --config FILE --node-id N [--data-dir DIR] [--seed S]

Hosts every group of the cluster with a `ChecksumStateMachine` (it counts the records applied and
keeps a running digest, so replicas can be compared) and serves the control protocol of
bench/raft_harness.py (propose, status, in-process load) on the member's `client_address`, so the
benchmark measures the Raft path without a client API. The arguments are those of `epochlog serve`:
tests/support/nodes.py's NodeCluster runs it with `module="bench.raft_node"`.
Prints `READY <node id> <address>` once listening; SIGTERM or SIGINT stop it cleanly. Exit codes: 0
after a clean stop, 2 when a group failed (e.g. a failed fsync: the node must not go on), 3 on a
configuration or start-up error.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from eventlog.errors import EpochlogError
from eventlog.raft.runtime.config import load_node_configs, parse_address
from eventlog.raft.runtime.host import NodeHost
from eventlog.raft.types import Entry, EntryKind, SnapshotMeta
from bench.raft_harness import HarnessServer


class ChecksumStateMachine:
    """Applies entries by counting records and chaining a SHA-256 digest over them.

    In memory; its snapshot is `{"applied", "records", "digest"}` as JSON. After a restart it starts
    from the snapshot (or empty) and Raft re-delivers the committed entries after it.
    """

    def __init__(self) -> None:
        self.applied_index = -1
        self.records = 0
        self.digest = hashlib.sha256().hexdigest()

    def apply(self, entries: Sequence[Entry]) -> None:
        for e in entries:
            assert e.index > self.applied_index, (e.index, self.applied_index)
            if e.kind is EntryKind.NORMAL:
                self.records += e.count
                h = hashlib.sha256(self.digest.encode())
                h.update(e.index.to_bytes(8, "big"))
                h.update(e.data[21:])  # the batch from its attributes on: what the CRC covers
                self.digest = h.hexdigest()
            self.applied_index = e.last_index

    def write_snapshot(self, path: Path) -> None:
        path.write_text(json.dumps({"applied": self.applied_index, "records": self.records,
                                    "digest": self.digest}))

    def restore(self, path: Path, meta: SnapshotMeta) -> None:
        state = json.loads(path.read_text())
        assert state["applied"] == meta.index, (state, meta)
        self.applied_index, self.records, self.digest = state["applied"], state["records"], state["digest"]


def _install_uvloop() -> str:
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


async def run_node(args: argparse.Namespace) -> int:
    configs = load_node_configs(args.config)
    data_dir = Path(args.data_dir or f"data/node-{args.node_id}")
    host = NodeHost(args.node_id, data_dir, configs, lambda name, directory: ChecksumStateMachine(), seed=args.seed)
    await host.start()
    address = configs.cluster.member(args.node_id).client_address
    harness = HarnessServer(args.node_id, lambda: host.groups)
    await harness.start(*parse_address(address, "client_address"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"READY {args.node_id} {address}", flush=True)
    failed = asyncio.create_task(_first_failure(host))
    stopped = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({failed, stopped}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if failed in done:
        logging.critical("node %s stops: %s", args.node_id, failed.result())
        code = 2
    failed.cancel()
    stopped.cancel()
    await harness.close()
    await host.stop()
    return code


async def _first_failure(host: NodeHost) -> str:
    """Resolves when a group failed (a failed fsync is fatal for the whole node)."""
    while True:
        for name, group in host.groups.items():
            if group.failed is not None:
                return f"group {name} failed: {group.failed!r}"
        await asyncio.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--config", required=True)
    parser.add_argument("--node-id", type=int, required=True)
    parser.add_argument("--data-dir")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format=f"%(asctime)s node{args.node_id} %(levelname)s %(name)s: "
                                                     "%(message)s", stream=sys.stderr)
    _install_uvloop()
    try:
        return asyncio.run(run_node(args))
    except EpochlogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
