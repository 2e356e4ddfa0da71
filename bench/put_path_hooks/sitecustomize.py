"""Hop marks for bench/put_path.py, loaded by the nodes it starts (this directory first on PYTHONPATH).

Nothing happens unless PUT_PATH_DIR is set. Then a few methods of the node get a wrapper that notes
`time.monotonic_ns()` and a tag as they start (and, for some, as they end); a thread writes the marks
to PUT_PATH_DIR/<pid>.marks every half second (appending), and the names it could not wrap to <pid>.missing (a
renamed method: the tool says so instead of measuring less without a word). CLOCK_MONOTONIC is one
clock for every process of the machine, so marks of several processes line up.
"""

from __future__ import annotations

import os

if os.environ.get("PUT_PATH_DIR"):
    import importlib.abc
    import importlib.util
    import inspect
    import sys
    import threading
    import time
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    _DIR = os.environ["PUT_PATH_DIR"]
    _marks: list[tuple[int, str]] = []
    _missing: list[str] = []
    _now = time.monotonic_ns

    def _wrap(module: ModuleType, owner: str, name: str, tag: str, *, end: bool = False,
              sized: bool = False) -> None:
        """Mark `tag` as `owner.name` starts (with the size of its first argument if `sized`) and, with
        `end` or for a coroutine (awaited whole), `tag`_end as it returns."""
        cls = getattr(module, owner, None)
        inner = getattr(cls, name, None) if cls is not None else None
        if inner is None:
            _missing.append(f"{module.__name__}.{owner}.{name}")
            return

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            _marks.append((_now(), f"{tag}:{len(args[0])}" if sized else tag))
            result = inner(self, *args, **kwargs)
            if end:
                _marks.append((_now(), tag + "_end"))
            return result

        async def awaited(self: Any, *args: Any, **kwargs: Any) -> Any:
            _marks.append((_now(), tag))
            result = await inner(self, *args, **kwargs)
            _marks.append((_now(), tag + "_end"))
            return result

        setattr(cls, name, awaited if inspect.iscoroutinefunction(inner) else wrapper)

    def _transport(m: ModuleType) -> None:
        _wrap(m, "_Connection", "data_received", "peer_in")
        _wrap(m, "_Connection", "buffer_updated", "peer_in")
        _wrap(m, "_Connection", "write", "peer_out", sized=True)

    def _segment(m: ModuleType) -> None:
        _wrap(m, "Segment", "write", "log_write")
        _wrap(m, "Segment", "sync", "sync", end=True)

    def _server(m: ModuleType) -> None:
        _wrap(m, "ClientConnection", "data_received", "client_in")
        _wrap(m, "ClientConnection", "_flush", "reply_out")

    def _views(m: ModuleType) -> None:
        _wrap(m, "ViewsStateMachine", "apply", "apply", end=True)

    def _ready_loop(m: ModuleType) -> None:
        _wrap(m, "ReadyLoop", "_step_inbox", "step", end=True)
        _wrap(m, "ReadyLoop", "_handle", "handle", end=True)

    def _node(m: ModuleType) -> None:
        _wrap(m, "Node", "start_write", "node_write")

    _PATCHES: dict[str, Callable[[ModuleType], None]] = {
        "eventlog.raft.runtime.transport": _transport, "eventlog.segment": _segment, "epochlog.server": _server,
        "statemachines.views": _views, "eventlog.raft.runtime.ready_loop": _ready_loop, "epochlog.node": _node}

    # With PUT_PATH_STEPS (put_path --steps): the steps inside those hops, each method marked as it starts
    # and ends (~1 us per mark: the hops' own figures grow by that).
    _STEPS: dict[str, list[tuple[str, str, str]]] = {
        "epochlog.calls": [("CallRunner", "run", "runner")],
        "eventlog.raft.peer_check": [("PeerCheck", "check", "peer_check")],
        "eventlog.raft.node": [("RaftNode", "step", "core_step"), ("RaftNode", "ready", "core_ready"),
                               ("RaftNode", "advance", "core_advance")],
        "eventlog.raft.runtime.group": [("RaftGroup", "submit", "submit"),
                                        ("RaftGroup", "_check_space", "check_space"),
                                        ("RaftGroup", "_submit_proposals", "propose"),
                                        ("RaftGroup", "_apply_committed", "apply_committed"),
                                        ("RaftGroup", "_answer_reads", "answer_reads"),
                                        ("RaftGroup", "_leader_turn_ended", "turn_ended")],
        "eventlog.raft.runtime.proposals": [("Proposals", "resolve", "resolve")],
        "eventlog.raft.runtime.host": [("NodeHost", "_flush", "peer_flush")],
        "eventlog.raft.runtime.log_storage": [("LogStorage", "append", "storage_append"),
                                              ("LogStorage", "_remember", "remember")],
        "eventlog.log": [("Log", "append_replica", "log_append")],
        "eventlog.log_flush": [("LogFlusher", "sync_active", "sync_active"),
                               ("LogFlusher", "notify_listeners", "notify_durable")],
        "statemachines.apply": [("Applier", "prepare", "prepare"), ("Applier", "commit", "commit"),
                                ("Applier", "_apply_records", "apply_records"), ("Applier", "_expire", "expire")],
        "statemachines.store": [("ViewStore", "write", "rocksdb_write")],
        "eventlog.raft.runtime.ready_loop": [("ReadyLoop", "_release_persisted", "release_persisted"),
                                             ("ReadyLoop", "_end_turn", "end_turn")],
    }

    def _steps(name: str, then: Callable[[ModuleType], None] | None) -> Callable[[ModuleType], None]:
        def patch(m: ModuleType) -> None:
            if then is not None:
                then(m)
            for owner, method, tag in _STEPS[name]:
                _wrap(m, owner, method, tag, end=True)
        return patch

    if os.environ.get("PUT_PATH_STEPS"):
        for _name in _STEPS:
            _PATCHES[_name] = _steps(_name, _PATCHES.get(_name))

    class _Finder(importlib.abc.MetaPathFinder):
        """Wraps a module of `_PATCHES` right after it is executed, before anyone uses it."""

        def __init__(self) -> None:
            self.finding: set[str] = set()

        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name not in _PATCHES or name in self.finding:
                return None
            self.finding.add(name)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                self.finding.discard(name)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module: ModuleType) -> None:
                run(module)
                _PATCHES[name](module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, _Finder())

    def _dump() -> None:
        """Append the marks noted since the last turn (the nodes are being measured: no rewriting)."""
        base = os.path.join(_DIR, str(os.getpid()))
        written = 0
        while True:
            time.sleep(0.5)
            upto = len(_marks)
            with open(base + ".marks", "a") as f:
                f.writelines(f"{t} {tag}\n" for t, tag in _marks[written:upto])
            written = upto
            with open(base + ".missing", "w") as f:   # known once the node's modules are imported
                f.write("\n".join(_missing))

    threading.Thread(target=_dump, name="put-path-marks", daemon=True).start()
