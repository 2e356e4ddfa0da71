"""Spark's Python workers import PySpark compiled from its installed package, not from Spark's zip
(spark/worker_daemon.py, the session's `spark.python.daemon.module`).

On the suite's real session: a worker's `pyspark` is the driver's package directory (before, it was
`pyspark.zip`, compiled again in every worker). The path rule on real directories: the pip-installed
PySpark's zip leaves the path only when the rest of the path imports that same package.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path
from typing import Any

import pyspark

from spark.worker_daemon import without_pyspark_zip

PACKAGE = Path(pyspark.__file__).resolve().parent
ZIP = str(PACKAGE / "python" / "lib" / "pyspark.zip")


def _worker_pyspark(_: Any) -> str:
    import pyspark as worker_pyspark

    return str(worker_pyspark.__file__)


def test_a_workers_pyspark_is_the_installed_package_not_the_zip(spark_session: Any) -> None:
    (origin,) = spark_session.sparkContext.parallelize([0], 1).map(_worker_pyspark).collect()
    assert ".zip" not in origin and Path(origin).resolve().parent == PACKAGE, origin


def test_the_zip_leaves_the_path_only_for_the_same_installed_package(tmp_path: Path) -> None:
    assert Path(ZIP).is_file(), "a pip-installed PySpark ships its zip"
    site = [entry for entry in sys.path if entry]
    assert without_pyspark_zip([ZIP, *site]) == site
    # Another PySpark earlier on the path: the worker would import that one, so the zip stays.
    other = tmp_path / "other"
    (other / "pyspark").mkdir(parents=True)
    (other / "pyspark" / "__init__.py").write_text("")
    assert without_pyspark_zip([ZIP, str(other), *site]) == [ZIP, str(other), *site]
    # A zip of a Spark that is not an installed package (a Spark distribution's SPARK_HOME) stays.
    dist_zip = tmp_path / "spark-4" / "python" / "lib" / "pyspark.zip"
    dist_zip.parent.mkdir(parents=True)
    zipfile.ZipFile(dist_zip, "w").close()
    assert without_pyspark_zip([str(dist_zip), *site]) == [str(dist_zip), *site]
    assert without_pyspark_zip(site) == site
