"""The Raft core is sans-IO (STYLE practice 1): nothing under eventlog/raft/*.py touches sockets,
files, clocks, threads, processes or the global random source. The simulator relies on it: the
same core runs under simulated time and an injected `random.Random`.

Two checks:

- static (AST), per module of the core package (eventlog/raft/*.py; the runtime subpackages that
  adapt it to real IO are not the core): no import of asyncio, socket, time, threading, random, os,
  select, selectors or subprocess -- except `import random` used only in type annotations (the
  injected `random.Random`), never called, never imported from;
- dynamic: importing the core in a fresh interpreter loads none of the networking, threading or
  process modules, directly or through anything it imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "eventlog" / "raft"
FORBIDDEN = {"asyncio", "socket", "time", "threading", "random", "os", "select", "selectors", "subprocess"}
CORE_MODULES = sorted(p for p in CORE.glob("*.py"))


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of every AST node inside a type annotation (id() used only for membership)."""
    inside: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            inside.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            mark(node.returns)
            a = node.args
            for arg in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]:
                if arg is not None:
                    mark(arg.annotation)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
    return inside


def io_problems(source: str, filename: str) -> list[str]:
    tree = ast.parse(source, filename)
    problems: list[str] = []
    random_imported = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top == "random" and alias.name == "random" and alias.asname is None:
                    random_imported = True
                elif top in FORBIDDEN:
                    problems.append(f"{filename}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in FORBIDDEN:
                problems.append(f"{filename}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            problems.append(f"{filename}:{node.lineno}: __import__(...)")
    if random_imported:
        annotations = _annotation_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "random" and id(node) not in annotations:
                problems.append(f"{filename}:{node.lineno}: `random` used outside a type annotation "
                                "(inject a random.Random instead)")
    return problems


def test_the_core_package_has_modules() -> None:
    names = {p.name for p in CORE_MODULES}
    assert {"node.py", "raft_log.py", "storage.py", "types.py", "progress.py", "confchange.py"} <= names


@pytest.mark.parametrize("path", CORE_MODULES, ids=lambda p: p.name)
def test_core_module_imports_no_io(path: Path) -> None:
    assert io_problems(path.read_text(), str(path.relative_to(ROOT))) == []


def test_the_checker_catches_io() -> None:
    assert io_problems("import time\n", "x.py")
    assert io_problems("from os import path\n", "x.py")
    assert io_problems("import asyncio.events\n", "x.py")
    assert io_problems("import random\nx = random.random()\n", "x.py")
    assert io_problems("import random\ndef f(r: random.Random = random.Random(1)) -> None: ...\n", "x.py")
    assert io_problems("from random import randrange\n", "x.py")
    assert io_problems("import random as r\n", "x.py")
    assert not io_problems("import random\ndef f(r: random.Random) -> random.Random: ...\n", "x.py")
    assert not io_problems("import random\nclass A:\n    rng: random.Random\n", "x.py")


def test_importing_the_core_loads_no_io_modules() -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import eventlog.raft, eventlog.raft.node, eventlog.raft.storage\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    # Not the C module `_socket`: typing_extensions (imported by msgspec) loads it only to find the
    # capsule type; networking code goes through `socket`, which stays forbidden.
    io = {"asyncio", "socket", "threading", "subprocess", "select", "selectors", "concurrent",
          "multiprocessing", "ssl", "mmap"}
    assert not loaded & io, f"importing the core loaded {sorted(loaded & io)}"
