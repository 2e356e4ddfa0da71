"""The layers of the product (docs/architecture.md), checked on every import statement (AST: nothing is run).

    eventlog  <-  statemachines  <-  epochlog.api  <-  controller, compaction  <-  epochlog

A package imports only from the layers below it and from itself: the controller and compaction not
from each other, nor from the node (they get what they use from it as callables); the api layer
(messages, frames, routing) only from eventlog and statemachines. Two parts of `epochlog` have rules
of their own: the SDK (epochlog.client) imports nothing of the server, only the api layer,
statemachines (the events and states it speaks) and eventlog.errors; and the command line, on top of
everything, is the only one to import spark, and only inside a function, so that no command but the
export's loads it: the CLI (epochlog.cli, LAZY_COMMANDS, lending the Spark commands what they share
with it through spark.cli.CommandLine) and `up --tour` (epochlog.tour, which runs an export). `spark`
talks to a cluster through the SDK and reads a stopped node with the public offline reader
(eventlog.offline, statemachines.offline), besides the event schema and the error root. That product
code never imports `tests` is tests/test_product_imports.py's to check.

Every import counts: at module level, in a function, under `if TYPE_CHECKING:` (a type-only import is
still a dependency of the design). A failure lists each import that breaks a rule, with file and line.
Two checks in a fresh interpreter back the static one: the SDK and the CLI load what the rules say.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("eventlog", "statemachines", "controller", "compaction", "epochlog", "spark")

# What the modules of each layer may import (module prefixes), besides the standard library and third
# parties. A module's layer is the longest key that is a prefix of its name.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "eventlog": ("eventlog",),
    "statemachines": ("eventlog", "statemachines"),
    "epochlog.api": ("eventlog", "statemachines", "epochlog.api"),
    "controller": ("eventlog", "statemachines", "epochlog.api", "controller"),
    "compaction": ("eventlog", "statemachines", "epochlog.api", "compaction"),
    "epochlog": ("eventlog", "statemachines", "epochlog.api", "controller", "compaction", "epochlog"),
    "epochlog.client": ("eventlog.errors", "statemachines", "epochlog.api", "epochlog.client"),
    "spark": ("spark", "epochlog.client", "epochlog.api", "eventlog.offline", "eventlog.errors",
              "statemachines.events", "statemachines.offline"),
}
# The command line: the one part of the product above spark, which it loads only inside a function.
COMMAND_LINE = ("epochlog.cli", "epochlog.tour")


@dataclass(frozen=True, slots=True)
class Import:
    importer: str
    imported: str
    path: str
    line: int
    lazy: bool          # inside a function


def _matches(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> str | None:
    found = [key for key in MAY_IMPORT if _matches(module, key)]
    return max(found, key=len) if found else None


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(module: str, source: str, path: str, *, package: bool = False) -> list[Import]:
    """Every import of a product package in `source` (the module `module`)."""
    found: list[Import] = []

    def add(name: str, node: ast.stmt, lazy: bool) -> None:
        found_here = Import(module, name, path, node.lineno, lazy)
        if name.split(".")[0] in PRODUCT and found_here not in found:
            found.append(found_here)

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child, lazy)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = module.split(".")[: len(module.split(".")) - child.level + (1 if package else 0)]
                    base = ".".join([*parts, *([child.module] if child.module else [])])
                for alias in child.names:
                    # `from epochlog.api import messages` imports the module epochlog.api.messages.
                    name = f"{base}.{alias.name}" if base else alias.name
                    add(name if _is_module(name) else base, child, lazy)
            visit(child, inner)

    visit(ast.parse(source, path), False)
    return found


def violation(i: Import) -> str | None:
    """Why `i` breaks a rule, or None."""
    layer = layer_of(i.importer)
    assert layer is not None, i.importer
    if i.importer in COMMAND_LINE and _matches(i.imported, "spark"):
        return None if i.lazy else (f"{i.importer} imports {i.imported} at module level: only in a function "
                                    "(the commands that do not export start without Spark)")
    allowed = MAY_IMPORT[layer]
    if any(_matches(i.imported, prefix) for prefix in allowed):
        return None
    return f"{i.importer} imports {i.imported}: {layer} may import only {', '.join(allowed)}"


def product_modules() -> list[tuple[str, Path]]:
    out = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return out


def test_every_import_keeps_to_the_layers() -> None:
    problems = []
    for module, path in product_modules():
        rel = str(path.relative_to(ROOT))
        for i in imports_of(module, path.read_text(), rel, package=path.name == "__init__.py"):
            why = violation(i)
            if why is not None:
                problems.append(f"{i.path}:{i.line}: {why}")
    assert not problems, "imports against the layers (tests/test_layers.py says why):\n" + "\n".join(problems)


def test_every_product_module_has_a_layer() -> None:
    modules = product_modules()
    assert len(modules) > 100
    assert [m for m, _ in modules if layer_of(m) is None] == []


def _problems(module: str, source: str) -> list[str]:
    return [why for i in imports_of(module, source, "x.py") if (why := violation(i)) is not None]


def test_the_checker_catches_imports_against_the_layers() -> None:
    assert _problems("eventlog.log", "from statemachines import events\n")
    assert _problems("statemachines.apply", "import epochlog.api.messages\n")
    assert _problems("epochlog.api.frames", "from controller.core import ControllerCore\n")
    assert _problems("controller.runtime", "if TYPE_CHECKING:\n    from epochlog.node import Node\n")
    assert _problems("controller.runtime", "from compaction import service\n")
    assert _problems("compaction.service", "from controller.runtime import ControllerRuntime\n")
    assert _problems("epochlog.client.aio", "def f():\n    from epochlog.node import Node\n")
    assert _problems("epochlog.client.aio", "from eventlog.raft.errors import NotLeaderError\n")
    assert _problems("epochlog.cli", "from spark import cli\n")
    assert _problems("epochlog.serve", "def f():\n    import spark.cli\n")
    assert _problems("spark.sources", "from eventlog.records import RecordBatch\n")
    assert _problems("spark.sources", "from statemachines.store import ViewStore\n")
    assert _problems("spark.export", "from epochlog.node import Node\n")
    assert _problems("spark.cli", "def f():\n    from epochlog.cli_client import Target\n")
    assert _problems("epochlog.tour", "from spark.export import export_once\n")
    assert _problems("epochlog.up", "def f():\n    from spark.export import export_once\n")
    assert _problems("epochlog.client.aio", "from .. import node\n")
    assert _problems("epochlog.client.aio", "from ..kafka.handler import KafkaHandler\n")


def test_the_checker_allows_what_the_layers_allow() -> None:
    assert not _problems("controller.routes", "from epochlog.api import messages as p\n")
    assert not _problems("epochlog.node", "from controller.runtime import ControllerRuntime\nimport compaction\n")
    assert not _problems("epochlog.client.aio", "from epochlog.api.routing import group_of_key\n"
                                                "from statemachines.sessions import session_id_at\n"
                                                "from eventlog.errors import EpochlogError\n")
    assert not _problems("epochlog.cli", "def f():\n    from spark import cli as spark_cli\n")
    assert not _problems("epochlog.tour", "def f():\n    from spark.export import export_once\n")
    assert not _problems("spark.sources", "from eventlog.offline import read_committed\n"
                                          "from statemachines import events\nfrom epochlog.client import Client\n")
    assert not _problems("statemachines.apply", "from . import events\nfrom .state import Outcome\n")


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys\nbefore = set(sys.modules)\n{statement}\nprint(' '.join(sorted(set(sys.modules) - before)))\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120)
    return set(out.stdout.split())


def test_the_sdk_loads_nothing_of_the_server() -> None:
    loaded = _loaded_after("import epochlog.client, epochlog.client.broker")
    server = sorted(m for m in loaded if m.split(".")[0] in ("controller", "compaction", "spark")
                    or (m.startswith("epochlog.") and layer_of(m) not in ("epochlog.api", "epochlog.client")))
    assert server == [], f"importing the SDK loaded server modules: {server}"


def test_the_cli_loads_spark_only_for_its_commands() -> None:
    loaded = _loaded_after("import epochlog.cli")
    spark = sorted(m for m in loaded if m.split(".")[0] in ("spark", "pyspark", "delta", "deltalake"))
    assert spark == [], f"importing the CLI loaded {spark}"
