"""The CLI's dispatch table (epochlog/cli.py LAZY_COMMANDS): it names every command its modules add, and a
command loads only its own module, so a CLI call or a node does not pay for the others' imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from epochlog.cli import LAZY_COMMANDS

ROOT = Path(__file__).resolve().parents[3]
COMMAND_MODULES = ("epochlog.cli_client", "epochlog.cli_brokers", "epochlog.cli_certs", "epochlog.cli_access",
                   "spark.cli")


def test_the_table_names_exactly_the_commands_each_module_registers() -> None:
    for loader in set(LAZY_COMMANDS.values()):
        group = click.Group("probe")
        loader()(group)
        assert sorted(group.commands) == sorted(n for n, lo in LAZY_COMMANDS.items() if lo is loader), loader


def _loaded_by(*argv: str) -> set[str]:
    """The modules loaded, in a fresh interpreter, by the CLI running `argv` (a --help: nothing runs)."""
    code = ("import sys\nfrom epochlog.cli import main\n"
            f"main({list(argv)!r})\nprint(' '.join(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120)
    return set(out.stdout.split())


def test_a_command_loads_only_its_own_module() -> None:
    for argv, wanted in ((("get", "--help"), "epochlog.cli_client"), (("certs", "init", "--help"), "epochlog.cli_certs"),
                         (("topic", "create", "--help"), "epochlog.cli_brokers"),
                         (("user", "--help"), "epochlog.cli_access")):
        loaded = _loaded_by(*argv)
        assert wanted in loaded, argv
        others = {m for m in COMMAND_MODULES if m != wanted and m not in _dependencies(wanted)}
        assert loaded & others == set(), f"{' '.join(argv)} loaded {sorted(loaded & others)}"
    served = _loaded_by("serve", "--help")
    assert served & {*COMMAND_MODULES, "cryptography"} == set(), sorted(served & {*COMMAND_MODULES, "cryptography"})


def test_get_loads_no_certificate_tooling_nor_rocksdb() -> None:
    loaded = _loaded_by("get", "--help")
    heavy = {m for m in loaded if m.split(".")[0] in ("cryptography", "rocksdict", "pyspark", "grpc", "kafka")}
    assert heavy == set() and "statemachines.store" not in loaded, sorted(heavy)


def _dependencies(module: str) -> set[str]:
    """The command modules `module` itself imports (the access and controller commands reuse the client's)."""
    return {"epochlog.cli_client"} if module in ("epochlog.cli_access", "epochlog.cli_brokers") else set()


def test_the_collector_paused_at_start_runs_again_when_a_command_runs() -> None:
    # `python -m epochlog` pauses it (epochlog/startup_gc.py); a command other than serve runs with it on,
    # and a collector someone else disabled stays off.
    code = ("import gc\nfrom epochlog import startup_gc\nstartup_gc.pause()\npaused = not gc.isenabled()\n"
            "import click\nfrom epochlog.cli import cli, main\n"
            "@cli.command('probe')\ndef probe():\n    print(paused, gc.isenabled())\n"
            "main(['probe'])\n"
            "gc.disable()\nstartup_gc.resume()\nprint(gc.isenabled())\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["True", "True", "False"], out.stdout + out.stderr
