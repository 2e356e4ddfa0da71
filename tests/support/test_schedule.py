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
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-n", str(workers),
         "--dist", "loadfile", "-rf"],
        cwd=tmp_path, env=_without_pytest_settings(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = run.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        out, _ = run.communicate()
        pytest.fail(f"the run did not end in 180 s:\n{out}")
    assert run.returncode == 1, out
    assert "1 failed, 8 passed" in out, out
    assert "crashed while running 'test_b.py::test_2'" in out, out


def _without_pytest_settings() -> dict[str, str]:
    """This process's environment without what would change the inner run: pytest's and xdist's settings
    (PYTEST_ADDOPTS, PYTEST_XDIST_*) and the suite's own (EPOCHLOG_TEST_*)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "EPOCHLOG_TEST"))}
