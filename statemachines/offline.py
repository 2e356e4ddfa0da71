"""Read-only views of a stopped node: the applied offset, and whether a record changed the views.

The export reads a stopped node's log with eventlog.offline.read_committed; this module answers, for
each record, what the node answers online (`read_events`' `applied`, statemachines/noops.py
`changed_views`) from the group's `views/` RocksDB opened read-only, so nothing is written to it and
its lock is not taken. Views that cannot be opened are no error: the records then say "unknown".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from statemachines.noops import changed_views, noops_from_meta
from statemachines.store import APPLIED, NOOPS_FROM, decode_offset


class OfflineViews:
    """A group's views opened read-only (`open`); `close()` when done. Not thread-safe."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self._cfs: dict[str, Any] = {}
        self._noops_from = noops_from_meta(db.get(NOOPS_FROM))

    @classmethod
    def open(cls, path: str | Path) -> OfflineViews | None:
        """The views in `path` (a group's `views/` directory), or None when there are none to open."""
        path = Path(path)
        if not (path / "CURRENT").exists():
            return None
        from rocksdict import AccessType, Options, Rdict

        try:
            # Every family the database has (views written before a family existed lack it).
            families = [name for name in Rdict.list_cf(str(path)) if name != "default"]
            db = Rdict(str(path), Options(raw_mode=True),
                       column_families={name: Options(raw_mode=True) for name in families},
                       access_type=AccessType.read_only())
        except Exception:   # noqa: BLE001 - no views is an answer too: records then say "unknown"
            return None
        return cls(db)

    def applied(self) -> int:
        """The offset the views applied through (-1: none)."""
        raw = self._db.get(APPLIED)
        return -1 if raw is None else decode_offset(raw)

    def applied_at(self, record_key: bytes | None, offset: int) -> bool | None:
        """Whether applying the record at `offset` changed the views, as the node answers online: from the
        `noops` rows, else from the history; None below the history floor, where its row may be pruned."""
        return changed_views(self._get, record_key, offset, self._noops_from)

    def _get(self, cf: str, key: bytes) -> bytes | None:
        if cf == "":
            return self._db.get(key)  # type: ignore[no-any-return]
        if cf not in self._cfs:
            try:
                self._cfs[cf] = self._db.get_column_family(cf)
            except Exception:   # noqa: BLE001 - a family these views do not have: nothing in it
                self._cfs[cf] = None
        family = self._cfs[cf]
        return None if family is None else family.get(key)

    def close(self) -> None:
        self._cfs.clear()
        self._db.close()
