"""Opening a group's views store (statemachines/store.py): RocksDB opens its table files with one thread
unless there are many, and a store reopened that way (its rows in table files) reads what was written."""

from __future__ import annotations

from pathlib import Path

from statemachines.store import ALL_CFS, MANY_TABLE_FILES, ViewsConfig, ViewStore, file_opening_threads

SMALL = ViewsConfig(block_cache_bytes=8 << 20, write_buffer_bytes=4 << 20)


def test_a_store_with_few_table_files_opens_them_with_one_thread_and_with_many_with_sixteen(tmp_path: Path) -> None:
    assert file_opening_threads(tmp_path) == 1
    for i in range(MANY_TABLE_FILES - 1):
        (tmp_path / f"{i:06d}.sst").touch()
    (tmp_path / "000001.log").touch()
    assert file_opening_threads(tmp_path) == 1
    (tmp_path / "999999.sst").touch()
    assert file_opening_threads(tmp_path) == 16


def test_a_store_reopened_with_its_rows_in_table_files_reads_every_row(tmp_path: Path) -> None:
    rows = {cf: {f"{cf}/{i}".encode(): f"{cf}-{i}".encode() * 10 for i in range(50)} for cf in ALL_CFS}
    store = ViewStore.open(tmp_path, SMALL)
    for cf, kv in rows.items():
        for key, value in kv.items():
            store.cfs[cf][key] = value
    store.close()
    for _ in range(2):   # the first reopen replays the WAL into table files, the second opens those
        store = ViewStore.open(tmp_path, SMALL)
        try:
            assert {cf: {k: store.get(cf, k) for k in kv} for cf, kv in rows.items()} == rows
        finally:
            store.close()
    assert list(tmp_path.glob("*.sst")), "the rows are in table files"
