"""The Kafka face produces, fetches and coordinates through node operations (epochlog/group_log.py).

It reads and appends a group's log through `Node.group_log` and never reaches into the Raft group,
its Raft core or its storage: those may change shape behind `GroupLog` (the log's split, the Raft
group's) without the face noticing. Read from the face's syntax trees: nothing is run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

FACE = Path(__file__).resolve().parents[3] / "epochlog" / "kafka"
# What only a Raft group, its core or its storage has: the face names none of them.
REACH_INS = {"storage", "submit", "sm", "role", "conf"}
RAFT_MODULES = ("eventlog.raft.runtime.group", "eventlog.raft.runtime.host", "eventlog.raft.node", "eventlog.log")


def _name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def reach_ins(source: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in REACH_INS:
            yield node.lineno, f".{node.attr}"
        elif isinstance(node, ast.Attribute) and node.attr in ("log", "node", "host") \
                and _name(node.value) in ("group", "node"):
            yield node.lineno, f"{_name(node.value)}.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module in RAFT_MODULES:
            names = {a.name for a in node.names}
            if names - {"LogRead"}:   # the type of what GroupLog.read returns
                yield node.lineno, f"from {node.module} import {', '.join(sorted(names))}"


def test_the_kafka_face_reaches_no_raft_group_nor_its_storage() -> None:
    found = [f"{path.name}:{line}: {what}" for path in sorted(FACE.glob("*.py"))
             for line, what in reach_ins(path.read_text(encoding="utf-8"))]
    assert not found, "use Node.group_log (epochlog/group_log.py):\n" + "\n".join(found)


def test_the_check_sees_each_reach_in() -> None:
    source = '''
log = ref.group.storage.log
await group.submit(records)
self.node.host.groups["kv"]
if g.node.role is Role.LEADER: pass
from eventlog.raft.runtime.group import RaftGroup
from eventlog.log import LogRead
chunk = ref.group.read(0, 10)
broker = Broker(1, b.host, b.port)
'''
    assert sorted({line for line, _ in reach_ins(source)}) == [2, 3, 4, 5, 6]
