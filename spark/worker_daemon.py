"""Spark's Python daemon for this package's sessions (`spark.python.daemon.module`): PySpark's own
daemon, with PySpark imported from its installed package instead of Spark's zip.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on its Python workers' path, and Python compiles
every module it imports from a zip again in every process (zipimport keeps no bytecode cache): a
worker spent seconds of CPU compiling PySpark before its first row. When SPARK_HOME is the
pip-installed `pyspark` package and the worker's path reaches that same package, the zip leaves the
path and the compiled modules beside it are used: the same files. Any other Spark keeps its zip.
(Spark starts its data source planners with PySpark's own daemon, not this one: they still compile.)
"""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path


def without_pyspark_zip(path: list[str]) -> list[str]:
    """`path` without the zip of a pip-installed PySpark (`<pyspark>/python/lib/pyspark.zip`) when the
    rest of `path` imports `pyspark` from that same package directory; else `path` unchanged."""
    zips = [entry for entry in path if Path(entry).name == "pyspark.zip"
            and Path(entry).parent.parts[-2:] == ("python", "lib")]
    if not zips:
        return path
    rest = [entry for entry in path if entry not in zips]
    spec = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    if spec is None or spec.origin is None:
        return path
    package = Path(spec.origin).resolve().parent
    if any(Path(z).resolve().parents[2] != package for z in zips):
        return path
    return rest


def main() -> None:
    sys.path[:] = without_pyspark_zip(sys.path)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
