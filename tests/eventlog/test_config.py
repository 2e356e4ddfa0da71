"""Config objects load from TOML and name the exact key and value when something is wrong."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from eventlog.config import LogConfig
from eventlog.configuration import describe, from_mapping
from eventlog.errors import ConfigError, EpochlogError

REPO = Path(__file__).resolve().parents[2]


def test_shipped_config_loads_and_documents_every_key():
    path = REPO / "configs" / "single.toml"
    shipped = LogConfig.from_toml(path)
    # The defaults, but for the segment size: small on a laptop (issue 22), the 64 MiB default in production.
    assert shipped.segment_bytes == 4 << 20 and LogConfig().segment_bytes == 64 << 20
    assert replace(shipped, segment_bytes=LogConfig().segment_bytes) == LogConfig()
    text = path.read_text()
    for name, _type, _default, doc in describe(LogConfig):
        assert f"\n{name} = " in text, f"configs/single.toml does not show log.{name}"
        assert doc, f"LogConfig.{name} has no documentation"


def test_values_are_taken():
    cfg = from_mapping(LogConfig, {"segment_bytes": 8192, "flush_policy": "fsync"}, "log")
    assert (cfg.segment_bytes, cfg.flush_policy, cfg.index_interval_bytes) == (8192, "fsync", 4096)
    assert cfg.batch_limit_bytes == 8192, "a batch can never exceed a segment"


@pytest.mark.parametrize(
    ("data", "key", "fragment"),
    [
        ({"segmnt_bytes": 1}, "log.segmnt_bytes", "unknown key"),
        ({"segment_bytes": "64MiB"}, "log.segment_bytes", "must be an integer"),
        ({"segment_bytes": True}, "log.segment_bytes", "must be an integer"),
        ({"segment_bytes": 100}, "log.segment_bytes", "must be >= 4096"),
        ({"segment_bytes": 2**40}, "log.segment_bytes", "must be <="),
        ({"flush_policy": "sometimes"}, "log.flush_policy", "must be one of 'fsync', 'group', 'interval'"),
        ({"preallocate_next_segment": 1}, "log.preallocate_next_segment", "must be true or false"),
        ({"flush_interval_ms": 0}, "log.flush_interval_ms", "must be >= 1"),
    ],
)
def test_bad_keys_and_values_are_named(data, key, fragment):
    with pytest.raises(ConfigError) as info:
        from_mapping(LogConfig, data, "log")
    err = info.value
    assert isinstance(err, EpochlogError)
    assert err.key == key
    assert err.value == next(iter(data.values()))
    assert fragment in str(err)
    assert key in str(err)


def test_unreadable_files_name_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[log]\nsegment_bytes = = 3\n")
    with pytest.raises(ConfigError, match="invalid TOML") as info:
        LogConfig.from_toml(bad)
    assert info.value.key == str(bad)
    with pytest.raises(ConfigError, match="not found"):
        LogConfig.from_toml(tmp_path / "missing.toml")


def test_config_is_frozen():
    cfg = LogConfig()
    with pytest.raises(AttributeError):
        cfg.segment_bytes = 1  # type: ignore[misc]


def test_views_section_of_the_shipped_config_documents_every_key():
    from eventlog.configuration import load_toml
    from statemachines.store import ViewsConfig

    path = REPO / "configs" / "single.toml"
    assert from_mapping(ViewsConfig, load_toml(path)["views"], "views") == ViewsConfig()
    text = path.read_text()
    for name, _type, _default, doc in describe(ViewsConfig):
        assert f"\n{name} = " in text and doc, f"configs/single.toml does not show views.{name}"
    with pytest.raises(ConfigError, match="views.write_buffer_bytes"):
        from_mapping(ViewsConfig, {"block_cache_bytes": 2 << 20, "write_buffer_bytes": 4 << 20}, "views")
