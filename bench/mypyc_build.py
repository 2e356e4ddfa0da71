"""Probe (issue-20-mypyc): compile the hot pure-Python modules ahead of time with mypyc, or remove the build.

Not part of the product build: `make venv` does not run it and nothing imports it. It exists so the
figures in bench/RESULTS.md (section issue-20-mypyc) can be made again.

    .venv/bin/pip install mypy                 # mypyc ships with mypy; needs gcc and Python.h
    .venv/bin/python -m bench.mypyc_build      # writes <module>.cpython-311-*.so beside each .py
    .venv/bin/python -m bench.mypyc_build --clean

Python imports an extension module before the .py of the same name in the same directory, so while the
.so files are there an edited .py is NOT what runs: `--clean` after the measurement. The modules are
those without msgspec Structs: mypyc creates a non-native class by calling its metaclass with the name,
bases and namespace only, so a Struct's class keywords (`frozen`, `kw_only`, `tag`, `array_like`) are
dropped (statemachines/events.py then fails at import; a module whose Structs would still build would
encode other bytes).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODULES = (
    "statemachines/apply.py",            # the applier: per record, per entry
    "eventlog/records.py",               # record_rows, encode_batch, decode_records
    "eventlog/raft/node.py",             # the Raft core (step, ready)
    "eventlog/raft/raft_log.py",
    "eventlog/raft/progress.py",
    "eventlog/raft/runtime/ready_loop.py",
)
# Not compiled, and why: eventlog/raft/runtime/group.py (the group task) and epochlog/node.py (Node.write)
# hold async generators, which mypyc does not implement; statemachines/events.py and sessions.py hold
# msgspec Structs (above).

# The project's [tool.mypy] is `strict`; mypyc refuses to compile on any mypy error, and strict mode
# reports many in modules it only follows. This config checks the compiled modules' own types.
_CONFIG = """[mypy]
python_version = 3.11
ignore_missing_imports = True
follow_imports = silent
"""


def built(root: Path = ROOT) -> list[Path]:
    """The mypyc outputs in the tree: one .so per compiled module and the group's shared library."""
    found = [p for m in MODULES for suffix in (".cpython-*.so", "__mypyc.cpython-*.so")
             for p in (root / m).parent.glob((root / m).stem + suffix)]
    return found + sorted(root.glob("*__mypyc.cpython-*.so"))


def clean(root: Path = ROOT) -> None:
    for p in built(root):
        p.unlink()
        print(f"removed {p.relative_to(root)}")
    shutil.rmtree(root / "build", ignore_errors=True)


def build(root: Path = ROOT, modules: tuple[str, ...] = MODULES) -> None:
    clean(root)
    with tempfile.TemporaryDirectory(prefix="mypyc-cfg-") as tmp:
        cfg = Path(tmp) / "mypy.ini"
        cfg.write_text(_CONFIG)
        subprocess.run([sys.executable, "-m", "mypyc", "--config-file", str(cfg), *modules], cwd=root,
                       check=True)
    shutil.rmtree(root / "build", ignore_errors=True)
    for p in built(root):
        print(f"built {p.relative_to(root)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clean", action="store_true", help="remove the compiled modules")
    ap.add_argument("modules", nargs="*", help=f"modules to compile (default: {' '.join(MODULES)})")
    args = ap.parse_args()
    if args.clean:
        clean()
    else:
        build(modules=tuple(args.modules) or MODULES)


if __name__ == "__main__":
    main()
