"""Where one `epochlog serve` start goes, phase by phase (CPU and wall of this process, all its threads):
the interpreter, the imports a node makes, reading the config, the peer TLS contexts, the views stores'
RocksDB opens, the rest of the node's start, and its stop. Run from the source tree of the build to
measure, with a config and a data directory (bench/startup.py --base-rev does both):

    python -m bench.startup_phases CONFIG NODE_ID DATA_DIR   (or run_path'd from another build's tree)

It runs what `epochlog serve` runs (epochlog/cli.py serve_command, epochlog/serve.py RunningNode.start),
wrapping `load_peer_tls` and `ViewStore.open` with timers (and the collector paused while it starts
where the build does that: epochlog/startup_gc.py), and prints one JSON object.
"""

import os
import time

# CPU since the process began; wall since the parent spawned it (it passes its clock: EPOCHLOG_SPAWNED_AT).
_CLOCKS = [0.0, time.monotonic() - (time.time() - float(os.environ.get("EPOCHLOG_SPAWNED_AT", time.time())))]
_PHASES: dict[str, list[float]] = {}


def _mark(phase: str) -> None:
    cpu, wall = time.process_time(), time.monotonic()
    _PHASES[phase] = [cpu - _CLOCKS[0], wall - _CLOCKS[1]]
    _CLOCKS[:] = [cpu, wall]


def main() -> None:
    import asyncio
    import gc
    import json
    import sys
    from pathlib import Path

    try:   # as `python -m epochlog` does, in a build that has it
        from epochlog import startup_gc
        startup_gc.pause()
    except ImportError:
        startup_gc = None
    _mark("interpreter")
    import epochlog.cli  # noqa: F401
    from epochlog.identity import resolve_member
    from epochlog.serve import RunningNode
    from eventlog import fault_injection  # noqa: F401
    from eventlog.raft.runtime import host, tls
    from eventlog.raft.runtime.config import load_node_configs
    from statemachines import store

    _mark("imports")
    config, node_id, data_dir = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    configs = load_node_configs(config)
    member = resolve_member(configs, node_id, data_dir)
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    _mark("config and loop")
    inner: dict[str, list[float]] = {"peer TLS": [0.0, 0.0], "views stores (RocksDB)": [0.0, 0.0]}

    def timed(label: str, function):  # type: ignore[no-untyped-def]
        def run(*args, **kwargs):  # type: ignore[no-untyped-def]
            cpu, wall = time.process_time(), time.monotonic()
            try:
                return function(*args, **kwargs)
            finally:
                inner[label][0] += time.process_time() - cpu
                inner[label][1] += time.monotonic() - wall
        return run

    host.load_peer_tls = timed("peer TLS", tls.load_peer_tls)
    opener = store.ViewStore.open.__func__  # type: ignore[attr-defined]
    store.ViewStore.open = classmethod(timed("views stores (RocksDB)", opener))  # type: ignore[method-assign]

    async def start_and_stop() -> None:
        running = await RunningNode.start(configs, node_id, data_dir, member=member)
        _mark("node start")
        if startup_gc is not None:
            gc.freeze()
            startup_gc.resume()
        await running.stop()
        _mark("stop")

    asyncio.run(start_and_stop())
    start = _PHASES.pop("node start")
    for label, (cpu, wall) in inner.items():
        _PHASES[label] = [cpu, wall]
        start = [start[0] - cpu, start[1] - wall]
    _PHASES["rest of the node start"] = start
    print(json.dumps(_PHASES))


if __name__ == "__main__":
    main()
