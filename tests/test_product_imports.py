"""Product code never imports the test suite.

The product packages (eventlog, statemachines, controller, compaction, epochlog, spark) are what a user
installs; tests/ holds the harnesses, simulators and fault tools that exercise them. A product module
that imports `tests...` (directly, through importlib, or by running `python -m tests...`) ships test
tooling, or depends on it at run time. The check reads every product module's syntax tree (nothing is
imported or run), so it holds for modules that are only imported lazily too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("eventlog", "statemachines", "controller", "compaction", "epochlog", "spark")


def _is_tests(module: str | None) -> bool:
    return module is not None and (module == "tests" or module.startswith("tests."))


def reaches_tests(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) of every way `source` reaches the tests package."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, f"import {a.name}") for a in node.names if _is_tests(a.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_tests(node.module):
            yield node.lineno, f"from {node.module} import ..."
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("import_module", "__import__") and _is_tests(str(node.args[0].value)):
                yield node.lineno, f"{name}({node.args[0].value!r})"
        elif isinstance(node, ast.List | ast.Tuple):
            values = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            for flag, module in zip(values, values[1:]):
                if flag == "-m" and isinstance(module, str) and _is_tests(module):
                    yield node.lineno, f"python -m {module}"


def test_no_product_module_imports_the_tests() -> None:
    found = []
    checked = 0
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            checked += 1
            found += [f"{path.relative_to(ROOT)}:{line}: {what}"
                      for line, what in reaches_tests(path.read_text(encoding="utf-8"))]
    assert checked > 100, f"only {checked} product modules found under {ROOT}"
    assert not found, "product code reaches into tests/:\n" + "\n".join(found)


def test_the_check_sees_every_way_in() -> None:
    source = '''
import json, tests.support.nodes
from tests.support import wait
from eventlog import log
import importlib
importlib.import_module("tests.sim")
__import__("tests")
cmd = [sys.executable, "-m", "tests.chaos", "--seconds", "5"]
"""python -m tests.sim in a docstring is prose, not an import"""
from .tests import helper
'''
    assert [line for line, _ in reaches_tests(source)] == [2, 3, 6, 7, 8]
