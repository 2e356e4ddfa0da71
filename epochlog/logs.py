"""Log records of a node name the node and, where one is involved, the Raft group and its term.

Context comes from two context variables, so nothing is threaded through call signatures:

- `NODE` is set while `RunningNode.start` runs, so every task, server and callback the node creates
  inherits it (asyncio copies the context into each task and handle);
- a group's tasks run with `eventlog.raft.runtime.group.CURRENT_GROUP` set to the group, and the
  term is read from it when the record is made (it is the term at that moment).

`ContextFilter`, attached to the handler, copies them onto every record as `node`, `group` and
`term` (None where unknown). Threads do not inherit context (the log's flusher); their records fall
back to the process's node id given to the filter.

Formats (`epochlog serve --log-format`), on stderr:

    text  2025-01-31T12:00:00.123Z INFO [n1 metadata t3] eventlog.raft.runtime.group: ...
    json  {"ts": "2025-01-31T12:00:00.123Z", "level": "INFO", "node": 1, "group": "metadata",
           "term": 3, "logger": "eventlog.raft.runtime.group", "msg": "..."}

one record per line (a JSON record's message and traceback, under "exc", keep their newlines
escaped). Timestamps are UTC, ISO 8601 with milliseconds.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Literal, TextIO

from eventlog.raft.runtime.group import CURRENT_GROUP

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

NODE: contextvars.ContextVar[int | None] = contextvars.ContextVar("epochlog_node", default=None)


class Throttled:
    """A WARNING that input from outside can repeat at will (a refused connection), logged at most once
    per `every_s` seconds by one `Throttled`: the next line says how many were left out meanwhile."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0) -> None:
        self.logger = logger
        self.every_s = every_s
        self._last = -every_s
        self._left_out = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._left_out += 1
            return
        if self._left_out:
            message += f" ({self._left_out} more such lines left out over the last {now - self._last:.0f} s)"
        self.logger.warning(message, *args)
        self._last = now
        self._left_out = 0


class ContextFilter(logging.Filter):
    """Adds `node`, `group`, `term` and `context` (their text form) to every record; drops none."""

    def __init__(self, node_id: int | None = None) -> None:
        super().__init__()
        self.node_id = node_id

    def filter(self, record: logging.LogRecord) -> bool:
        group = CURRENT_GROUP.get()
        if group is not None:
            node: int | None = group.node_id
            name: str | None = group.name
            term: int | None = group.node.term
        else:
            node = NODE.get()
            node = self.node_id if node is None else node
            name = term = None
        record.node, record.group, record.term = node, name, term
        parts = [f"n{node}" if node is not None else "-"]
        if name is not None:
            parts += [name, f"t{term}"]
        record.context = " ".join(parts)
        return True


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = (f"{_timestamp(record)} {record.levelname} [{getattr(record, 'context', '-')}] "
                f"{record.name}: {record.getMessage()}")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": _timestamp(record), "level": record.levelname, "node": getattr(record, "node", None),
            "group": getattr(record, "group", None), "term": getattr(record, "term", None),
            "logger": record.name, "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(log_format: LogFormat = "text", node_id: int | None = None, *, level: int | None = None,
              stream: TextIO | None = None) -> logging.Handler:
    """Send the process's log records to `stream` (stderr) in `log_format`, replacing the root
    logger's handlers; returns the new handler."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(ContextFilter(node_id))
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    if level is not None:
        root.setLevel(level)
    return handler
