"""`make test`'s scheduler (tests/support/schedule.py): a run in which a worker dies ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


CRASHING_RUN = {
    "test_a.py": "".join(f"def test_{i}():\n    pass\n\n\n" for i in range(4)),
    "test_b.py": "import os\n\n\ndef test_1():\n    pass\n\n\ndef test_2():\n    os._exit(3)\n\n\n"
                 "def test_3():\n    pass\n",
    "test_c.py": "def test_1():\n    pass\n",
    "test_d.py": "def test_1():\n    pass\n",
}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_whose_worker_dies_ends_with_the_rest_run_once(tmp_path: Path, workers: int) -> None:
    """xdist 3.8's loadfile hangs here (pytest-xdist issues 1323, 1327): with one worker, the one that
    died had finished test_a.py, which went back to the queue and came to the replacement as a run
    command with no test. With our scheduler the run ends: the test the worker died in failed, every
    other test passed once."""
    for name, text in CRASHING_RUN.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "from tests.support.schedule import EndsAfterACrash\n\n\n"
        "def pytest_xdist_make_scheduler(config, log):\n    return EndsAfterACrash(config, log)\n")
    out = _run_inner_pytest(tmp_path, workers)
    assert "1 failed, 8 passed" in out, out
    assert "crashed while running 'test_b.py::test_2'" in out, out


WORKER_GONE_FIRST = """
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, {repo!r})
from xdist.workermanage import WorkerController

from tests.support.schedule import EndsAfterACrash

TEST_1 = "test_b.py::test_1"
handled = threading.Event()


class Scheduler(EndsAfterACrash):
    def mark_test_complete(self, node, item_index, duration=0):
        try:
            super().mark_test_complete(node, item_index, duration)
        finally:
            if self.registered_collections[node][item_index] == TEST_1:
                handled.set()


def pytest_xdist_make_scheduler(config, log):
    return Scheduler(config, log)


def pytest_runtest_logreport(report):
    \"\"\"On the controller, TEST_1's last report waits until the worker that ran it has died (in test_2).\"\"\"
    if report.nodeid != TEST_1 or report.when != "teardown" or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    pid = int(Path("worker.pid").read_text())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{{pid}}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return
        except FileNotFoundError:
            return
        time.sleep(0.02)
    raise AssertionError(f"worker {{pid}} did not die in 60 s")


_process_from_remote = WorkerController.process_from_remote


def _late_end(self, eventcall):
    \"\"\"The receiver thread learns of the worker's end only after TEST_1's completion was handled.\"\"\"
    if not isinstance(eventcall, tuple):
        handled.wait(60)
    return _process_from_remote(self, eventcall)


WorkerController.process_from_remote = _late_end
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_a_report_handled_after_its_worker_died_does_not_end_the_run_in_an_internal_error(
        tmp_path: Path, workers: int) -> None:
    """CI saw this: a worker reported test_b::test_1 done and died in test_2; the controller answered that
    report with more work before its receiver thread had marked the worker down, the send met a broken pipe
    and the run ended in an INTERNALERROR (exit 3). The conftest makes that order certain (the report is
    handled once the worker is dead, the receiver thread learns of the end after it); the run must end as
    any run with a crashed worker does."""
    files = dict(CRASHING_RUN)
    files["test_b.py"] = files["test_b.py"].replace(
        "def test_1():\n    pass\n", "def test_1():\n    open('worker.pid', 'w').write(str(os.getpid()))\n")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "conftest.py").write_text(WORKER_GONE_FIRST.format(repo=str(REPO)))
    out = _run_inner_pytest(tmp_path, workers)
    assert "INTERNALERROR" not in out, out
    assert "1 failed, 8 passed" in out, out
    assert "crashed while running 'test_b.py::test_2'" in out, out


def _run_inner_pytest(cwd: Path, workers: int) -> str:
    """Run pytest in `cwd` with `workers` xdist workers by loadfile; its output, after checking it exited 1."""
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-n", str(workers),
         "--dist", "loadfile", "-rf"],
        cwd=cwd, env=_without_pytest_settings(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        out, _ = run.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        out, _ = run.communicate()
        pytest.fail(f"the run did not end in 180 s:\n{out}")
    assert run.returncode == 1, out
    return out


def _without_pytest_settings() -> dict[str, str]:
    """This process's environment without what would change the inner run: pytest's and xdist's settings
    (PYTEST_ADDOPTS, PYTEST_XDIST_*) and the suite's own (EPOCHLOG_TEST_*)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "EPOCHLOG_TEST"))}
