"""`make test`'s order of test files (tests/support/schedule.py): slowest first, tests/spark as one unit,
the JVM units after a few others while the machine has no Spark CDS archive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.schedule import DURATIONS, JVMS_AFTER, order_units, read_durations, unit_of

REPO = Path(__file__).resolve().parents[2]
DURATIONS_OF = {"tests/a/test_few.py": 90.0, "tests/a/test_many.py": 20.0, "tests/spark/test_x.py": 50.0,
                "tests/spark/test_y.py": 45.0, "tests/epochlog/test_tour.py": 60.0}


def test_units_go_slowest_first_and_spark_is_one_unit() -> None:
    units = ["tests/a/test_many.py", "tests/new/test_unlisted.py", "tests/a/test_few.py", "tests/spark/",
             "tests/epochlog/test_tour.py"]
    assert unit_of("tests/spark/test_x.py") == "tests/spark/" and unit_of("tests/a/test_few.py") == "tests/a/test_few.py"
    assert order_units(units, DURATIONS_OF) == ["tests/spark/", "tests/a/test_few.py", "tests/epochlog/test_tour.py",
                                                "tests/a/test_many.py", "tests/new/test_unlisted.py"]


def test_without_the_archive_the_jvm_units_wait_for_a_few_others() -> None:
    others = [f"tests/o/test_{i}.py" for i in range(JVMS_AFTER + 2)]
    durations = {**DURATIONS_OF, **{name: 10.0 - i for i, name in enumerate(others)}}
    units = [*others, "tests/spark/", "tests/epochlog/test_tour.py"]
    assert order_units(units, durations, archive_ready=False) == [
        *others[:JVMS_AFTER], "tests/spark/", "tests/epochlog/test_tour.py", *others[JVMS_AFTER:]]


def test_the_kept_list_names_test_files_that_exist() -> None:
    root = DURATIONS.parents[1]
    listed = read_durations()
    assert len(listed) > 50 and all(seconds > 0 for seconds in listed.values())
    assert [name for name in listed if not (root / name).is_file()] == []
    assert read_durations(Path("/nonexistent")) == {}


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
        "from tests.support.schedule import SlowestFirst\n\n\n"
        "def pytest_xdist_make_scheduler(config, log):\n    return SlowestFirst(config, log)\n")
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-n", str(workers),
         "--dist", "loadfile", "-rf"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = run.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        out, _ = run.communicate()
        pytest.fail(f"the run did not end in 180 s:\n{out}")
    assert run.returncode == 1, out
    assert "1 failed, 8 passed" in out, out
    assert "crashed while running 'test_b.py::test_2'" in out, out
