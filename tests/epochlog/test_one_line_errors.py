"""What a newcomer's first mistakes print: one line and an exit code, never a traceback.

`serve` with a port in use or a data directory it cannot make, a config that is not TOML, a client
whose connection dies without a word, and `log verify` pointed at a directory above the log.
"""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
import threading

import pytest

from eventlog.config import LogConfig
from eventlog.log import Log
from eventlog.records import encode_batch
from eventlog.raft.runtime.config import parse_address
from epochlog.client import AsyncClient, UnavailableError
from tests.epochlog.local_cluster import ROOT, cluster_document, epochlog_argv, write_config


@pytest.fixture
def rng() -> random.Random:
    seed = random.SystemRandom().getrandbits(32)
    print(f"port seed={seed}")
    return random.Random(seed)


def _epochlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(epochlog_argv(*args), capture_output=True, text=True, cwd=ROOT, timeout=120)


def _one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_serve_refuses_a_port_in_use_in_one_line(tmp_path, rng):
    document = cluster_document(1, rng)
    config = write_config(tmp_path / "single.toml", document)
    taken = document["cluster"]["members"][0]["client_address"]
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(parse_address(taken, "test"))
        listener.listen()
        result = _epochlog("serve", "--config", str(config), "--node-id", "1", "--data-dir", str(tmp_path / "n1"))
    line = _one_line(result, 3)
    assert line == f"error: node 1 cannot listen on {taken} (client_address): in use by another process", line


def test_serve_refuses_a_data_directory_it_cannot_make_in_one_line(tmp_path, rng):
    config = write_config(tmp_path / "single.toml", cluster_document(1, rng))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = _epochlog("serve", "--config", str(config), "--node-id", "1", "--data-dir", str(blocker / "node-1"))
    line = _one_line(result, 3)
    assert line == f"error: node 1 cannot use its data directory {blocker / 'node-1'}: Not a directory", line
    up = _epochlog("up", "--config", str(config), "--data-dir", str(blocker / "up"), "--once")
    assert _one_line(up, 3) == f"error: cannot use {blocker / 'up'} as the data directory: Not a directory"


def test_a_config_that_is_not_toml_is_named_without_a_value(tmp_path):
    config = tmp_path / "broken.toml"
    config.write_text("[cluster\nname = 'x'\n")
    line = _one_line(_epochlog("serve", "--config", str(config), "--node-id", "1"), 3)
    assert line.startswith(f"error: config {config}: invalid TOML: "), line
    assert "None" not in line


def test_a_connection_closed_without_a_word_names_the_error():
    """A peer that resets the connection during the hello: the reason is never empty."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    address = f"127.0.0.1:{server.getsockname()[1]}"

    def reset_every_connection() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            conn.close()   # linger 0: an RST, which asyncio reports as ConnectionResetError

    threading.Thread(target=reset_every_connection, daemon=True).start()

    async def call() -> str:
        async with AsyncClient([address], timeout=1.0) as client:
            with pytest.raises(UnavailableError) as info:
                await client.status(address)
            return str(info.value)
    try:
        message = asyncio.run(call())
    finally:
        server.close()
    assert message.startswith(f"cannot connect to {address}: "), message
    assert not message.endswith(": "), message


def test_log_verify_refuses_a_directory_without_a_log_and_names_the_log_below(tmp_path):
    group = tmp_path / "node-1" / "groups" / "kv"
    with Log.open(group / "log", LogConfig(segment_bytes=1 << 16)) as log:
        log.append(encode_batch([(b"kv/k", b"v")], timestamp_ms=1000), epoch=1)
    result = _epochlog("log", "verify", str(group))
    line = _one_line(result, 2)
    assert line == f"error: {group} holds no log (no segment file *.log); logs below it: {group / 'log'}", line
    assert result.stdout == ""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _one_line(_epochlog("log", "verify", str(empty)), 2) == f"error: {empty} holds no log (no segment file *.log)"
    assert _epochlog("log", "verify", str(group / "log")).returncode == 0   # the log itself is clean
