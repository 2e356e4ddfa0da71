"""`epochlog log dump` / `log verify` / `demo` run as real processes on real log directories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eventlog.config import LogConfig
from eventlog.log import Log
from eventlog.records import encode_batch

CFG = LogConfig(segment_bytes=8192, index_interval_bytes=512, flush_policy="fsync")
REPO = Path(__file__).resolve().parents[3]


def epochlog(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epochlog", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    path = tmp_path / "log"
    with Log.open(path, CFG) as log:
        for i in range(60):
            log.append(encode_batch([(f"topic/t{i}".encode(), b"x" * 100), (None, b"y")], timestamp_ms=1000 + i),
                       epoch=1 + i // 20)
    return path


def last_segment(path: Path) -> Path:
    return max(path.glob("*.log"))


def test_verify_clean_log_exits_0(log_dir):
    result = epochlog("log", "verify", str(log_dir))
    assert result.returncode == 0, result.stderr
    assert "verdict: clean" in result.stdout
    report = json.loads(epochlog("log", "verify", "--json", str(log_dir)).stdout)
    assert report["verdict"] == "clean"
    assert sum(s["records"] for s in report["segments"]) == 120
    assert report["epochs"] == [[1, 0], [2, 40], [3, 80]]


def test_verify_torn_tail_exits_1_and_recovery_then_makes_it_clean(log_dir):
    seg = last_segment(log_dir)
    data = bytearray(seg.read_bytes())
    end = Log.open(log_dir, CFG)
    end_pos = end._segments[-1].size
    end.close()
    tail = encode_batch([(b"k", b"partial" * 20)], timestamp_ms=5)
    data[end_pos:end_pos + 50] = tail[:50]
    seg.write_bytes(bytes(data))
    result = epochlog("log", "verify", str(log_dir))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "torn tail of 50 bytes" in result.stderr
    with Log.open(log_dir, CFG) as log:
        assert log.recovery.bytes_truncated == 50
    assert epochlog("log", "verify", str(log_dir)).returncode == 0


@pytest.mark.parametrize(("field_offset", "message"), [
    (40, "CRC mismatch"),                          # inside the CRC range
    (14, "leader epoch checkpoint records epoch 1"),  # partitionLeaderEpoch: outside the CRC
    (6, "expected 2"),                             # baseOffset: outside the CRC
])
def test_verify_mid_log_corruption_exits_2(log_dir, field_offset, message):
    first = min(log_dir.glob("*.log"))
    data = bytearray(first.read_bytes())
    second_batch = int.from_bytes(data[8:12], "big") + 12
    data[second_batch + field_offset] ^= 0x55
    first.write_bytes(bytes(data))
    result = epochlog("log", "verify", str(log_dir))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{first.name}: byte {second_batch}:" in result.stderr
    assert message in result.stderr


def test_dump_lists_batches_with_keys_and_crc(log_dir):
    rows = [json.loads(line) for line in epochlog("log", "dump", "--json", str(log_dir)).stdout.splitlines()]
    assert [r["base_offset"] for r in rows] == list(range(0, 120, 2))
    assert all(r["crc_ok"] for r in rows)
    assert rows[5]["keys"] == ["topic/t5", None]
    assert rows[5]["epoch"] == 1 and rows[25]["epoch"] == 2
    assert rows[5]["max_timestamp"] == 1005
    text = epochlog("log", "dump", "--from", "100", "--limit", "3", str(log_dir)).stdout.splitlines()
    assert len(text) == 4 and "100..101" in text[1] and "topic/t50" in text[1]


def test_usage_and_operational_errors_have_their_own_exit_codes(tmp_path):
    assert epochlog("log", "verify").returncode == 64
    assert epochlog("log", "verify", str(tmp_path / "nope")).returncode == 64
    empty = tmp_path / "empty"
    empty.mkdir()
    result = epochlog("log", "verify", str(empty))
    assert result.returncode == 2 and "holds no log" in result.stderr and "clean" not in result.stdout, result
    # A node's group directory is not its log: the refusal names the log below it (issue 22).
    group = tmp_path / "node" / "groups" / "kv"
    with Log.open(group / "log", CFG) as log:
        log.append(encode_batch([(b"kv/a", b"1")], timestamp_ms=1000), epoch=1)
    result = epochlog("log", "verify", str(group))
    assert result.returncode == 2 and str(group / "log") in result.stderr, result
    assert epochlog("log", "verify", str(group / "log")).returncode == 0


def test_demo_runs_end_to_end(tmp_path):
    result = epochlog("demo", "--data-dir", str(tmp_path / "demo"), "--seconds", "0.5", "--seed", "3", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "acknowledged batches are present and intact" in result.stdout
    assert "log verify after recovery: clean" in result.stdout
