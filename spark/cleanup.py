"""Removal of the files a failed export run left behind, by the next run, once no commit can use them.

A run (batch or streaming) writes its Parquet files first and commits them after; killed in between,
it leaves files that no version references (invisible to readers, but paid for in storage and in
every listing). Deleting unreferenced files is only safe when they can never be committed: another
run of the same offsets may still be writing them. The rule:

- every export file is named `part-<group>-<first offset>-<uuid>.zstd.parquet` (spark.commit): the
  group and an offset of its rows;
- a commit of a run that read offset `o` of group `g` is refused once the table's app transaction
  `exporter/<g>` reaches `o` (spark.commit.commit_run, the streaming sink alike): the run started at
  or before `o`, so its range overlaps what is already exported, and app transaction versions only
  grow;
- so a file that the current version does not reference, that is not a tombstone (removed by an
  optimize: older versions still read it until vacuum deletes it), and whose `<first offset>` is at
  or below the current watermark of its group, can never be referenced: it is deleted.

Files of other writers (delta-rs's optimize names its own `part-00001-<uuid>-c000...`) never match
and are left to vacuum. A tombstone past `delta.deletedFileRetentionDuration` leaves the snapshot;
such a file is then deleted here as vacuum would delete it.
"""

from __future__ import annotations

from typing import Any

from spark.commit import parse_data_file_name
from spark.storage import TableLocation
from spark.table import exported_through, referenced_paths


def dead_files(loc: TableLocation, dt: Any) -> list[str]:
    """Files below the table root that no commit can ever reference (see the module docstring)."""
    referenced = referenced_paths(dt)
    candidates: dict[str, tuple[str, int]] = {}
    for f in loc.list_files():
        if f.path in referenced:
            continue
        named = parse_data_file_name(f.path)
        if named is not None:
            candidates[f.path] = named
    if not candidates:
        return []
    marks = exported_through(dt, sorted({g for g, _ in candidates.values()}))
    dead = [p for p, (g, first) in candidates.items() if first <= marks[g]]
    if not dead:
        return []
    tombstones = {loc.relative(p) for p in dt.vacuum(retention_hours=0, dry_run=True,
                                                       enforce_retention_duration=False, full=False)}
    return sorted(p for p in dead if p not in tombstones)


def remove_dead_files(loc: TableLocation, dt: Any) -> list[str]:
    """Delete `dead_files`; the paths deleted."""
    dead = dead_files(loc, dt)
    for path in dead:
        loc.delete(path)
    return dead

