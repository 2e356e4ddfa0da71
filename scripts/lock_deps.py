"""Write constraints.txt: the exact version of every package `pip install -e '.[dev]'` installs.

`make venv` (and so `make run`, `make test` and CI on a fresh machine) installs with these constraints,
so every machine runs the suite against the versions it last passed with: a new release of a dependency
cannot change a result unseen (msgspec 0.23 changed the error a string that is not UTF-8 raises, and
CI, which installed it the day it came out, failed where this machine passed). pyproject.toml keeps
the ranges the code supports; this file is one tested point in them.

To move to newer releases: `make lock` (this script: pip resolves `.[dev]` from scratch, the newest
versions the ranges allow, without installing anything), then `make test`, and commit both.

    .venv/bin/python scripts/lock_deps.py [--out constraints.txt]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = """\
# The exact versions `make venv` installs (pip install -c constraints.txt -e '.[dev]'): the set the
# suite last passed with. Made by `make lock` (scripts/lock_deps.py); pyproject.toml has the ranges.
"""


def resolve() -> dict[str, str]:
    """{package: version} of what pip would install for `.[dev]` into an empty environment."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                        "--report", str(report), ".[dev]"], cwd=ROOT, check=True)
        installs = json.loads(report.read_text())["install"]
    return {item["metadata"]["name"]: item["metadata"]["version"] for item in installs
            if item["metadata"]["name"].lower() != "epochlog"}   # this project itself, installed editable


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "constraints.txt")
    args = ap.parse_args()
    pins = resolve()
    lines = [f"{name}=={version}" for name, version in sorted(pins.items(), key=lambda p: p[0].lower())]
    args.out.write_text(HEADER + "\n".join(lines) + "\n")
    print(f"{args.out}: {len(lines)} packages pinned")


if __name__ == "__main__":
    main()
