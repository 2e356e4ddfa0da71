"""`make test`'s order of test files (tests/support/schedule.py): slowest first, tests/spark as one unit,
the JVM units after a few others while the machine has no Spark CDS archive."""

from __future__ import annotations

from pathlib import Path

from tests.support.schedule import DURATIONS, JVMS_AFTER, order_units, read_durations, unit_of

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
