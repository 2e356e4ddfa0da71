"""Every fenced block of README.md and docs/*.md is run, checked or says why not (issue 22).

A page marks each fenced block with an HTML comment on the line before it (invisible on GitHub):

    <!-- runnable -->                   the block runs and ends well (a toml block: the config loader
                                        reads it, a member table inside a [cluster])
    <!-- runnable; prints TEXT -->      ... and prints TEXT
    <!-- runnable; needs TOOL -->       ... when TOOL is on the PATH (skipped, saying so, when not)
    <!-- output -->                     a sample of output: it must follow a runnable block, and each of
                                        its lines (numbers aside) is a line that block printed
    <!-- not run: REASON -->            a block that cannot run here (a picture, a multi-host set-up)

An unmarked block fails test_every_block_is_marked. The blocks of a page run in order, in a working
directory of their own, against one real 3-node cluster (Kafka and gRPC faces on) that every page
shares (so each page names its own topics and broker groups), with configs/local-3.toml's addresses (and grpc.md's 750N)
swapped for the cluster's. A python block runs as a script (a top-level `await` runs in an event
loop); an sh block line by line (comments dropped) with `epochlog` and the venv's tools on the PATH and
EPOCHLOG_ENDPOINTS naming the cluster. A line whose comment mentions Ctrl-C streams: once it has
printed and then been quiet for a second (a few seconds at most, for a stream that prints nothing), it
gets SIGINT, and must end with exit 0. A line whose comment shows what it prints
(`# offset 12 ...`, `# prints ...: lease 0x3da0...`) binds that sample to what the cluster printed: later lines of the
page use the real offset or lease id. docs/kafka.md runs in tests/epochlog/kafka/test_docs.py,
docs/protocol.md's examples in tests/epochlog/test_protocol_doc.py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from eventlog.config import LogConfig
from eventlog.log import Log
from eventlog.raft.runtime.config import load_node_configs
from eventlog.records import encode_batch
from tests.support.fixtures import shared_cluster_of
from tests.support.nodes import ROOT, NodeCluster

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ELSEWHERE = {"docs/kafka.md", "docs/protocol.md"}    # run by their own tests (module docstring)
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)
MARK = re.compile(r"^<!-- (runnable(?:; [^>]*?)?|output|not run: .+?) -->$")
LOCAL = tomllib.loads((ROOT / "configs" / "local-3.toml").read_text())["cluster"]["members"]
GRPC_LOCAL = [f"127.0.0.1:750{i}" for i in (1, 2, 3)]     # docs/grpc.md's scheme beside local-3's
BINDS = re.compile(r"^\s*(?:.*\bprints [^:]*: )?(offset \d+|lease 0x[0-9a-f]+|table version \d+)\b")  # a comment showing what it prints
TIMEOUT_S = 300.0      # an export run starts Spark
STREAM_S = 4.0         # the longest a stream runs before its SIGINT
QUIET_S = 1.0          # ... or this long after it printed, when it printed and went quiet
ASSIGNMENT = re.compile(r"^(?:export )?([A-Z_]+)=")
STOPPED_LOG = Path("data/local/node-1/groups/kv")    # made in each page's working directory


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    mark: str | None      # the marker comment's text, None when unmarked
    end: int              # the line of the closing fence

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def options(self) -> dict[str, str]:
        """`prints` and `needs` of a runnable marker."""
        parts = (self.mark or "").split("; ")[1:]
        return {p.split(" ", 1)[0]: p.split(" ", 1)[1] for p in parts}


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    out = []
    for m in BLOCK.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.match(before)
        out.append(Block(str(page.relative_to(ROOT)), text[:m.start()].count("\n") + 1, m.group(1),
                         m.group(2), mark.group(1) if mark else None, text[:m.end()].count("\n")))
    return out


def pages() -> list[str]:
    return [str(p.relative_to(ROOT)) for p in PAGES if str(p.relative_to(ROOT)) not in ELSEWHERE]


def test_every_block_is_marked() -> None:
    found = [b for page in pages() for b in blocks(ROOT / page)]
    assert len(found) > 30, found
    unmarked = [str(b) for b in found if b.mark is None]
    assert not unmarked, f"mark these blocks runnable, output or not run (tests/epochlog/test_doc_snippets.py): {unmarked}"
    assert all(b.language in ("python", "sh", "toml") for b in found if b.mark.startswith("runnable")), found
    for b in found:
        if b.mark == "output":
            page = blocks(ROOT / b.page)
            previous = page[page.index(b) - 1] if page.index(b) else None
            assert previous is not None and previous.mark.startswith("runnable") and b.line - previous.end <= 6, \
                f"{b}: an output block follows the runnable block that prints it (a sentence between at most)"


def missing_output(sample: str, printed: str) -> list[str]:
    """The lines of an output sample that are not lines of `printed`; numbers and hex ids (offsets,
    lease ids, timings) and the width of the space between columns may differ."""
    def pattern(line: str) -> str:
        parts = re.split(r"(0x[0-9a-f]+|\d+(?:\.\d+)?|\s+)", line.strip())
        return "".join(r"0x[0-9a-f]+" if p.startswith("0x") else r"\d+(?:\.\d+)?" if p[:1].isdigit()
                       else r"\s+" if p.isspace() else re.escape(p) for p in parts if p)
    return [line for line in sample.splitlines()
            if line.strip() and not re.search(rf"^\s*{pattern(line)}\s*$", printed, re.M)]


def test_an_output_sample_matches_only_what_was_printed() -> None:
    printed = "offset 41 (group kv)\nkey    app/x\nlease  0x3da0cc191a4c29fb granted, ttl 30.0 s\n"
    assert missing_output("offset 12 (group kv)\nkey app/x\nlease 0x15b9 granted, ttl 10 s", printed) == []
    assert missing_output("offset 12 (group offsets)\nkey app/y", printed) == ["offset 12 (group offsets)", "key app/y"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    yield from shared_cluster_of(request, tmp_path_factory.mktemp("snippets"), kafka=True, grpc=True)


def for_cluster(code: str, cluster: NodeCluster) -> str:
    """`code` with configs/local-3.toml's addresses replaced by `cluster`'s (a list of them first)."""
    grpc = [n.grpc_address for n in cluster.nodes.values()]
    pairs = [(",".join(m["client_address"] for m in LOCAL), ",".join(cluster.endpoints)),
             (",".join(m["kafka_address"] for m in LOCAL), ",".join(cluster.bootstrap))]
    pairs += [(m["client_address"], cluster.endpoints[i]) for i, m in enumerate(LOCAL)]
    pairs += [(m["kafka_address"], cluster.bootstrap[i]) for i, m in enumerate(LOCAL)]
    pairs += list(zip(GRPC_LOCAL, grpc, strict=True))
    for local, ours in pairs:
        code = code.replace(local, ours)
    return code


class Page:
    """One page's blocks run in order: the samples bound so far and the environment they run in."""

    def __init__(self, cluster: NodeCluster, cwd: Path) -> None:
        self.cluster, self.cwd = cluster, cwd
        write_stopped_log(cwd / STOPPED_LOG)
        (cwd / "proto").symlink_to(ROOT / "proto")       # "from the repository root" (docs/grpc.md)
        (cwd / "configs").mkdir()                          # `--config configs/local-3.toml`: this cluster
        shutil.copy(cluster.config_path, cwd / "configs" / "local-3.toml")
        self.bound: dict[str, str] = {}        # a sample in the page ("12", "0x3da0...") -> the real one
        self.env = dict(os.environ, EPOCHLOG_ENDPOINTS=",".join(cluster.endpoints),
                        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
                        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))

    def substitute(self, code: str) -> str:
        code = for_cluster(code, self.cluster).replace(".venv/bin/epochlog", "epochlog")
        if not self.bound:
            return code
        samples = re.compile(r"\b(" + "|".join(map(re.escape, self.bound)) + r")\b")
        return samples.sub(lambda m: self.bound[m.group(1)], code)

    def bind(self, comment: str, printed: str, where: str) -> None:
        for sample in BINDS.findall(comment):
            kind, value = sample.rsplit(" ", 1)
            real = re.search(rf"\b{kind}\"?:? +\"?(\w+)", printed)     # `offset 12` or JSON's `"offset": "12"`
            assert real, f"{where}: the comment says it prints {sample!r}; it printed:\n{printed}"
            self.bound[value] = real.group(1)

    def run(self, block: Block) -> str:
        if block.language == "toml":
            return self.load_toml(block)
        if block.language == "python":
            return self.run_line(block, PYTHON_RUNNER, self.substitute(block.code), streams=False, argv=True)
        printed = ""
        for raw in block.code.replace("\\\n", " ").replace("|\n", "| ").splitlines():
            line, _, comment = raw.partition(" #")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if ASSIGNMENT.match(line.strip()):      # `P="..."`, `export X=...`: for the page's later lines
                name = ASSIGNMENT.match(line.strip()).group(1)
                self.env[name] = self.run_line(block, None, f'{self.substitute(line.strip())}; printf %s "${name}"',
                                               streams=False)
                continue
            out = self.run_line(block, None, self.substitute(line.strip()), streams="Ctrl-C" in comment)
            self.bind(comment, out, f"{block}: {line.strip()!r}")
            printed += out
        return printed

    def run_line(self, block: Block, runner: str | None, code: str, *, streams: bool, argv: bool = False) -> str:
        command = [sys.executable, "-c", runner, code] if argv else ["bash", "-c", code]
        if streams:
            out, err, code_ = stream(command, self.cwd, self.env)
        else:
            done = subprocess.run(command, capture_output=True, text=True, cwd=self.cwd, env=self.env,
                                  timeout=TIMEOUT_S)
            out, err, code_ = done.stdout, done.stderr, done.returncode
        if streams and not code.startswith("epochlog"):     # another tool may die of the SIGINT
            code_ = 0 if code_ in (-signal.SIGINT, 128 + signal.SIGINT) else code_
        assert code_ == 0, f"{block}: {code[-400:]!r} exited {code_}:\n{out[-2000:]}\n{err[-3000:]}"
        return out

    def load_toml(self, block: Block) -> str:
        """A config snippet is read by the node's config loader; a lone member table inside a cluster."""
        text = block.code if "[cluster]" in block.code else f'[cluster]\nname = "docs"\n\n{block.code}'
        path = self.cwd / f"snippet-{block.line}.toml"
        path.write_text(text)
        configs = load_node_configs(path)
        document = tomllib.loads(text)
        for member in document["cluster"]["members"]:
            loaded = next(m for m in configs.cluster.members if m.id == member["id"])
            for key, value in member.items():
                assert getattr(loaded, key) == value, f"{block}: {key} read as {getattr(loaded, key)!r}"
        return ""


def default_sigint() -> None:
    """In the child, before exec: SIGINT as a terminal's shell leaves it. A suite started in the
    background (`make test &`, CI runners) inherits SIGINT ignored, and a Go program such as grpcurl
    keeps it ignored: the Ctrl-C this test sends would never stop it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stream(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, str, int]:
    """Run a streaming command as a user watching it would: SIGINT once it has printed something and
    been quiet for QUIET_S (it showed what it streams), or after STREAM_S; a stream with an end
    (`--count`) may end by itself. (stdout, stderr, exit code)."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=cwd, env=env, start_new_session=True, preexec_fn=default_sigint)
    lines: list[tuple[float, str]] = []         # (when read, line)
    errors: list[str] = []

    def read_out() -> None:
        for line in child.stdout:                 # type: ignore[union-attr]
            lines.append((time.monotonic(), line))

    def read_err() -> None:
        errors.extend(child.stderr)               # type: ignore[arg-type]

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for reader in readers:
        reader.start()
    started = time.monotonic()
    while child.poll() is None:
        now = time.monotonic()
        if now - started >= STREAM_S or (lines and now - lines[-1][0] >= QUIET_S):
            os.killpg(child.pid, signal.SIGINT)
            break
        time.sleep(0.05)
    child.wait(TIMEOUT_S)
    for reader in readers:
        reader.join(TIMEOUT_S)
    return "".join(x for _, x in lines), "".join(errors), child.returncode


def write_stopped_log(path: Path) -> None:
    """A closed log where the offline tools' examples (docs/log.md) expect a stopped node's kv log:
    60 batches of two records (a key rewritten every 20 batches, so `clean` has something to drop)."""
    with Log.open(path, LogConfig(segment_bytes=8192, index_interval_bytes=512)) as log:
        for i in range(60):
            log.append(encode_batch([(f"app/k{i % 20}".encode(), b"x" * 100), (None, b"y")],
                                    timestamp_ms=1000 + i), epoch=1 + i // 20)


# Runs argv[1] as a module's top level; a top-level await runs it in an event loop.
PYTHON_RUNNER = """\
import ast, asyncio, sys
code = compile(sys.argv[1], "<snippet>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
namespace = {"__name__": "__main__"}
result = eval(code, namespace)
if asyncio.iscoroutine(result):
    asyncio.run(result)
"""


@pytest.mark.parametrize("page", pages())
def test_page_blocks_run(page: str, cluster: NodeCluster, tmp_path: Path) -> None:
    """The runnable blocks of `page` run in order; each output block is in what the block before printed."""
    runner, printed = Page(cluster, tmp_path), ""
    for block in blocks(ROOT / page):
        if block.mark is None or block.mark.startswith("not run"):
            continue
        if block.mark == "output":
            missing = missing_output(block.code, printed)
            assert not missing, f"{block}: {missing} not in what the block before printed:\n{printed}"
            continue
        needs = block.options.get("needs")
        if needs and shutil.which(needs, path=runner.env["PATH"]) is None:
            print(f"{block}: skipped, {needs} is not on the PATH")
            continue
        printed = runner.run(block)
        print(f"{block}:\n{printed}")
        if "prints" in block.options:
            assert block.options["prints"] in printed, f"{block} should print {block.options['prints']!r}:\n{printed}"
