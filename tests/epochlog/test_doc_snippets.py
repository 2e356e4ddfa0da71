"""The snippets of README.md and docs/*.md marked runnable run, against a real 3-node cluster.

A page marks a fenced block runnable with an HTML comment on the line before it (invisible on GitHub):

    <!-- runnable -->                   the block runs and ends well
    <!-- runnable; prints TEXT -->      ... and prints TEXT

The snippets are written for the cluster `epochlog up` starts (configs/local-3.toml); this test swaps
that config's client and Kafka addresses for its own cluster's. A python block runs as a script; an sh
block line by line (comments dropped) with `epochlog` on the PATH and EPOCHLOG_ENDPOINTS naming the
cluster. docs/kafka.md's examples run in tests/epochlog/kafka/test_docs.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.fixtures import shared_cluster_of
from tests.support.nodes import ROOT, NodeCluster

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"^<!-- runnable(?:; prints (.+?))? -->\n```(\w+)\n(.*?)^```", re.M | re.S)
LOCAL = tomllib.loads((ROOT / "configs" / "local-3.toml").read_text())["cluster"]["members"]
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    language: str
    code: str
    prints: str | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def snippets() -> list[Snippet]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in MARK.finditer(text):
            out.append(Snippet(str(page.relative_to(ROOT)), text[:m.start()].count("\n") + 2, m.group(2),
                               m.group(3), m.group(1)))
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    yield from shared_cluster_of(request, tmp_path_factory.mktemp("snippets"), kafka=True)


def for_cluster(code: str, cluster: NodeCluster) -> str:
    """`code` with configs/local-3.toml's addresses replaced by `cluster`'s (a list of them first)."""
    pairs = [(",".join(m["client_address"] for m in LOCAL), ",".join(cluster.endpoints)),
             (",".join(m["kafka_address"] for m in LOCAL), ",".join(cluster.bootstrap))]
    pairs += [(m["client_address"], cluster.endpoints[i]) for i, m in enumerate(LOCAL)]
    pairs += [(m["kafka_address"], cluster.bootstrap[i]) for i, m in enumerate(LOCAL)]
    for local, ours in pairs:
        code = code.replace(local, ours)
    return code


def test_the_pages_mark_snippets_runnable() -> None:
    found = snippets()
    assert {s.page for s in found} >= {"README.md", "docs/node.md"}, found
    assert all(s.language in ("python", "sh") for s in found), found


@pytest.mark.parametrize("snippet", snippets(), ids=str)
def test_snippet_runs(snippet: Snippet, cluster: NodeCluster) -> None:
    code = for_cluster(snippet.code, cluster)
    env = dict(os.environ, EPOCHLOG_ENDPOINTS=",".join(cluster.endpoints),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    if snippet.language == "python":
        runs = [[sys.executable, "-c", code]]
    else:
        lines = [line.split(" #")[0].strip() for line in code.splitlines()]
        runs = [["bash", "-c", line] for line in lines if line and not line.startswith("#")]
    printed = ""
    for argv in runs:
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=TIMEOUT_S)
        assert done.returncode == 0, f"{snippet}: {argv[-1]!r} exited {done.returncode}:\n{done.stderr[-3000:]}"
        printed += done.stdout
    print(printed)
    if snippet.prints is not None:
        assert snippet.prints in printed, f"{snippet} should print {snippet.prints!r}:\n{printed}"
