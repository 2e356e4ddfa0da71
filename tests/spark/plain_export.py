"""An export run without Spark, for tests whose subject is the table, not the exporter.

It writes the files and makes the commit the Spark writer makes (one `spark.commit.DayFiles` per
range, `spark.commit.commit_run` with the plan), in this process: no Spark job, which costs seconds
each on a loaded machine. The exporter itself is tested through Spark (test_source.py,
test_offline_export.py, test_cluster_export.py, test_object_storage.py).
"""

from __future__ import annotations

from pathlib import Path

from spark.commit import DayFiles, commit_run
from spark.plan import ExportPlan
from spark.records import to_batch
from spark.sources import OfflineSource
from spark.storage import TableLocation
from spark.table import exported_through, open_or_create


def plain_export(table: Path | TableLocation, source: OfflineSource, *, range_offsets: int = 10**9) -> int:
    """One run of everything `source` has committed past the table's watermarks: its table version."""
    dt = open_or_create(table)
    plan = ExportPlan.make(exported_through(dt, [g.group for g in source.groups]), source.bounds(),
                           range_offsets=range_offsets)
    files = []
    for r in plan.ranges():
        out = DayFiles(table)
        for chunk in source.read(r.group, r.lo, r.hi):
            out.write(to_batch(r.group, chunk))
        files += out.close()
    return commit_run(table, files, plan)
