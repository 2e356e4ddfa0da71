"""constraints.txt (the exact versions `make venv` installs) agrees with pyproject.toml and with what runs.

A dependency added to pyproject.toml without `make lock` would be installed at whatever version is newest
the day a machine is set up, the drift the file exists to stop; a pin outside pyproject's range would make
`make venv` fail on a fresh machine only.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and name and version, f"constraints.txt: {line!r} is not name==version"
        key = canonicalize_name(name)
        assert key not in pins, f"constraints.txt pins {name} twice"
        pins[key] = Version(version)
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]


def test_every_dependency_of_pyproject_is_pinned_within_its_range() -> None:
    pins = _pins()
    env = default_environment()
    for req in _requirements():
        if req.marker is not None and not req.marker.evaluate({**env, "extra": "dev"}):
            continue
        pinned = pins.get(canonicalize_name(req.name))
        assert pinned is not None, f"{req.name} is in pyproject.toml but not in constraints.txt: run `make lock`"
        assert req.specifier.contains(pinned, prereleases=True), (
            f"constraints.txt pins {req.name}=={pinned}, outside pyproject.toml's {req.specifier}: run `make lock`")


def test_the_environment_runs_the_pinned_versions() -> None:
    # What `make venv` installed: a venv older than constraints.txt is installed again by `make test`.
    wrong = []
    for name, version in _pins().items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue   # a platform's package (pinned where it installs)
        if installed != version:
            wrong.append(f"{name} {installed} (constraints.txt: {version})")
    assert not wrong, f"installed versions differ from constraints.txt: {', '.join(wrong)}; run `make venv`"
