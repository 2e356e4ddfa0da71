"""The one error table (eventlog/errors.py): every code has its row, and every face reports it by that row.

The faces are the real functions each server calls on a failure: the native protocol's `wire_error`
(epochlog/calls.py), gRPC's `failure` (epochlog/grpc/convert.py), Kafka's `kafka_code`
(epochlog/kafka/errors.py), the SDK's `from_wire` (epochlog/client/errors.py, what a reply becomes)
and the CLI's exit code (`exit_code`, epochlog/cli.py). Product modules are found by reading their
syntax trees, so a row declared next to a tool (the cleaner, `up`, the export) is checked too.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from eventlog import kafka_codes as kc
from eventlog.errors import (
    EXIT_ERROR,
    REJECTIONS,
    ROW_FIELDS,
    EpochlogError,
    NotLeaderError,
    RejectedError,
    error_class,
    error_classes,
    from_code,
)
from epochlog.api import messages as p
from epochlog.calls import call_error, wire_error
from epochlog.client.errors import from_wire
from epochlog.grpc.convert import failure
from epochlog.kafka.errors import kafka_code

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("eventlog", "statemachines", "controller", "compaction", "epochlog", "spark")
KAFKA_CODES = {v for k, v in vars(kc).items() if k.isupper() and isinstance(v, int)}
CLI_RESERVED = {0, 1, 64, 130}   # success, `log verify`/`up`/`status` findings, usage, interrupted


def _product_files() -> Iterator[Path]:
    for package in PRODUCT:
        yield from sorted((ROOT / package).rglob("*.py"))


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _declares_a_code(source: str) -> bool:
    """A class body assigning `code = "..."`: a row of the table."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if (isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "code" for t in stmt.targets)
                        and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
                    return True
    return False


@pytest.fixture(scope="module")
def rows() -> dict[str, type[EpochlogError]]:
    """Every row, with the modules that declare one imported (found by their source, not by a list)."""
    declaring = [_module(f) for f in _product_files() if _declares_a_code(f.read_text(encoding="utf-8"))]
    assert "eventlog.errors" in declaring and len(declaring) > 5, declaring
    for name in declaring:
        importlib.import_module(name)
    table = error_classes()
    assert len(table) > 40, sorted(table)
    return table


def _instance(cls: type[EpochlogError]) -> EpochlogError:
    if cls is RejectedError:
        return RejectedError(p.WriteResult(12, "kv", False, "version_mismatch", "at version 3"))
    return from_code(cls.code, f"a {cls.code} error")


def test_every_code_states_its_row(rows: dict[str, type[EpochlogError]]) -> None:
    unstated = {code: [f for f in ROW_FIELDS if f not in vars(cls)] for code, cls in rows.items()
                if cls is not EpochlogError}
    assert not {c: f for c, f in unstated.items() if f}, "a class naming a code states its row"
    for code, cls in rows.items():
        assert cls.code == code and error_class(code) is cls
        assert isinstance(cls.retriable, bool), code
        assert cls.grpc_status in grpc.StatusCode.__members__ and cls.grpc_status != "OK", code
        assert cls.kafka_error in KAFKA_CODES and cls.kafka_error != kc.NONE, code
        assert isinstance(cls.exit_code, int) and 1 < cls.exit_code < 126, code
        assert cls.exit_code not in CLI_RESERVED, code


def test_every_face_maps_every_code_through_its_row(rows: dict[str, type[EpochlogError]]) -> None:
    for code, cls in rows.items():
        error = _instance(cls)
        wire = wire_error(error)
        assert (wire.code, wire.retriable, wire.message) == (code, cls.retriable, str(error)), code
        again = from_wire(wire)   # the SDK raises the same class the server did
        assert type(again) is cls and again.code == code and again.retriable == cls.retriable, code
        status = failure(error, {})
        assert status.status == grpc.StatusCode[error.grpc_status], code
        assert (status.error.code, status.error.retriable) == (code, cls.retriable), code
        assert kafka_code(error) == cls.kafka_error, code


def test_a_rejection_is_reported_by_its_reason(rows: dict[str, type[EpochlogError]]) -> None:
    for reason, row in REJECTIONS.items():
        assert row.grpc_status in grpc.StatusCode.__members__, reason
        assert row.kafka_error is None or row.kafka_error in KAFKA_CODES, reason
        rejected = RejectedError(p.WriteResult(7, "kv", False, reason, "changed nothing"))
        status = failure(rejected, {})
        assert status.status == grpc.StatusCode[row.grpc_status], reason
        assert dict(status.metadata())["epochlog-reason"] == reason and status.error.offset == 7
        expected = row.kafka_error if row.kafka_error is not None else kc.UNKNOWN_SERVER_ERROR
        assert kafka_code(rejected) == expected, reason
    assert failure(RejectedError(p.WriteResult(7, "kv", False, "not_found", "")), {}).status == grpc.StatusCode.NOT_FOUND


def test_what_is_not_an_epochlog_error_is_internal_or_a_deadline() -> None:
    bug = ValueError("bad")
    assert wire_error(call_error(bug)).code == "internal"
    assert failure(bug, {}).status == grpc.StatusCode.INTERNAL
    assert kafka_code(bug) == kc.UNKNOWN_SERVER_ERROR
    late = TimeoutError()
    assert wire_error(call_error(late)).code == "deadline_exceeded"
    assert failure(late, {}).status == grpc.StatusCode.DEADLINE_EXCEEDED
    assert kafka_code(late) == kc.REQUEST_TIMED_OUT
    # a retriable error raised once the call's deadline passed: the deadline, naming what it waited for
    waited = call_error(from_code("not_caught_up", "applied 4 < 9"), timeout=2.0, deadline_passed=True)
    assert waited.code == "deadline_exceeded" and "applied 4 < 9" in str(waited)
    assert call_error(from_code("not_found", "no key"), deadline_passed=True).code == "not_found"


def test_a_code_this_build_does_not_know_keeps_its_name_and_flag() -> None:
    newer = from_code("from_a_newer_node", "what it said", retriable=True)
    assert type(newer) is EpochlogError and newer.code == "from_a_newer_node" and newer.retriable
    assert wire_error(newer).code == "from_a_newer_node"
    assert newer.exit_code == EXIT_ERROR


def test_the_leader_rides_along_on_every_face() -> None:
    error = NotLeaderError(node=1, leader_hint=3, term=7)
    wire = wire_error(error, "127.0.0.1:7003")
    assert (wire.leader, wire.leader_address) == (3, "127.0.0.1:7003")
    again = from_wire(wire)
    assert isinstance(again, NotLeaderError) and (again.leader_hint, again.leader_address) == (3, "127.0.0.1:7003")
    status = failure(error, {3: "127.0.0.1:9003"})
    assert dict(status.metadata())["epochlog-leader"] == "127.0.0.1:9003" and status.error.leader == 3


def test_one_class_per_code_and_per_name(rows: dict[str, type[EpochlogError]]) -> None:
    with pytest.raises(TypeError, match="one class per code"):
        type("AnotherNotFound", (EpochlogError,), {"code": "not_found", "__module__": "tests.elsewhere"})
    seen: dict[str, str] = {}
    stack = [EpochlogError]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.__module__.split(".")[0] not in PRODUCT:
            continue
        where = f"{cls.__module__}.{cls.__qualname__}"
        assert seen.setdefault(cls.__name__, where) == where, f"{cls.__name__}: {seen[cls.__name__]} and {where}"


def _literal_codes(source: str, codes: set[str]) -> Iterator[tuple[int, str]]:
    """(line, code) where `source` names a code by its string: compared with a `.code` or `.reason`, or
    passed as a `code=`/`reason=` argument or as the code of an Outcome, Rejected or WireError."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(isinstance(s, ast.Attribute) and s.attr in ("code", "reason") for s in sides)
            for s in sides:
                if named and isinstance(s, ast.Constant) and s.value in codes:
                    yield node.lineno, s.value
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in ("code", "reason") and isinstance(kw.value, ast.Constant) and kw.value.value in codes:
                    yield node.lineno, kw.value.value
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("Outcome", "Rejected", "WireError", "_reject", "from_code"):
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and arg.value in codes:
                        yield node.lineno, arg.value


def test_no_product_code_names_a_code_by_its_string(rows: dict[str, type[EpochlogError]]) -> None:
    codes = set(rows) | set(REJECTIONS)
    found = [f"{path.relative_to(ROOT)}:{line}: {code!r}" for path in _product_files()
             if path != ROOT / "eventlog" / "errors.py"
             for line, code in _literal_codes(path.read_text(encoding="utf-8"), codes)]
    assert not found, "name codes by their class (NotFoundError.code) or constant (NOT_FOUND):\n" + "\n".join(found)


def test_the_literal_check_sees_each_form() -> None:
    source = '''
if exc.code == "not_found": pass
raise ClientError("x", code="invalid_argument")
Outcome(False, offset, "already_exists", "made once")
p.WireError("bad_frame", "m")
if role == "fenced": pass
'''
    assert [line for line, _ in _literal_codes(source, {"not_found", "invalid_argument", "already_exists",
                                                         "bad_frame", "fenced"})] == [2, 3, 4, 5]
