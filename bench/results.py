"""Write one benchmark's results into bench/RESULTS.md, replacing its previous section.

Each benchmark owns a section delimited by `<!-- BEGIN name -->` / `<!-- END name -->`, headed by
the machine it ran on and the command that produced it, so results stay reproducible.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
_HEADER = "# Benchmark results\n\nEach section is replaced by the benchmark that owns it; rerun the command shown to reproduce.\n"


def machine() -> str:
    """One line describing the machine: CPU model, cores, memory, kernel, Python."""
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (f"{cpu}, {os.cpu_count()} cores{mem}, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def git_revision() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def invocation() -> str:
    """The command line that ran this process, as a user would type it: `python -m bench.x args`.

    Under `python -m`, argv[0] is the module's file path; it is named as the module again.
    """
    script, *args = sys.argv
    path = Path(script).resolve()
    root = Path(__file__).resolve().parent.parent
    if path.suffix == ".py" and path.is_relative_to(root):
        script = ".".join(path.relative_to(root).with_suffix("").parts)
    return " ".join([Path(sys.executable).name, "-m", script, *args])


def write_section(name: str, body: str, command: str | None = None) -> None:
    """Replace (or add) section `name` of bench/RESULTS.md with `body` (markdown)."""
    command = command or invocation()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = (f"<!-- BEGIN {name} -->\n## {name}\n\n"
               f"- machine: {machine()}\n- command: `{command}`\n- when: {stamp}, revision {git_revision()}\n\n"
               f"{body.rstrip()}\n<!-- END {name} -->\n")
    text = RESULTS.read_text() if RESULTS.exists() else _HEADER
    pattern = re.compile(rf"<!-- BEGIN {re.escape(name)} -->.*?<!-- END {re.escape(name)} -->\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section, text)
    else:
        text = text.rstrip() + "\n\n" + section
    RESULTS.write_text(text)
