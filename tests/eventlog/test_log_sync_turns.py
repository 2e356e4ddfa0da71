"""Syncs once per turn (`Log.sync_once_per_turn`, `Log.sync_turn`; eventlog/log_flush.py): when the
flusher thread is woken and when the caller syncs itself, and that durability means the same either way."""

from __future__ import annotations

import os
import threading

import pytest

from eventlog.config import LogConfig
from eventlog.errors import LogFailedError
from eventlog.log import Log
from eventlog.log_flush import INLINE_AFTER, PROBE_EVERY
from eventlog.records import encode_batch

CFG = LogConfig(segment_bytes=256 * 1024, flush_policy="group")


def batch(i: int) -> bytes:
    return encode_batch([(b"k%d" % i, b"v" * 40)], timestamp_ms=1_000)


def turn(lg: Log, i: int) -> bool:
    """One turn of a lone writer: append, sync_turn, wait until durable; whether it synced inline."""
    info = lg.append(batch(i), epoch=1)
    inline = lg.sync_turn()
    if inline:
        assert lg.durable_offset == lg.end_offset, "an inline sync returns with the append durable"
    else:
        assert lg.wait_durable(info.last_offset, timeout=10)
    return inline


def test_a_lone_writer_syncs_inline_once_the_thread_bought_nothing_and_probes_the_thread(tmp_path) -> None:
    heard: list[int] = []
    with Log.open(tmp_path / "l", CFG) as lg:
        lg.sync_once_per_turn()
        lg.add_durability_listener(heard.append)
        modes = [turn(lg, i) for i in range(INLINE_AFTER + 2 * (PROBE_EVERY + 1))]
        assert lg.durable_offset == lg.end_offset == len(modes)
    assert modes[:INLINE_AFTER] == [False] * INLINE_AFTER, "the thread first"
    rest = modes[INLINE_AFTER:]
    assert rest == ([True] * PROBE_EVERY + [False]) * 2, "then inline, every PROBE_EVERY+1-th to the thread"
    assert len(heard) == INLINE_AFTER + 2, "listeners hear of the thread's syncs only"


def test_an_append_during_a_thread_sync_brings_the_thread_back(tmp_path, monkeypatch) -> None:
    """Group commit pays off again (an append arrived while the thread synced): the thread takes the
    next turns' syncs until it has again synced INLINE_AFTER times with nothing appended meanwhile."""
    real = os.fdatasync
    in_sync, release = threading.Event(), threading.Event()

    def gated(fd: int) -> None:   # the real fdatasync; the flusher thread's waits until released
        if threading.current_thread().name.startswith("log-flusher") and not release.is_set():
            in_sync.set()
            release.wait(10)
        real(fd)

    with Log.open(tmp_path / "o", CFG) as lg:
        lg.sync_once_per_turn()
        modes = [turn(lg, i) for i in range(INLINE_AFTER + 1)]
        assert modes == [False] * INLINE_AFTER + [True]
        monkeypatch.setattr(os, "fdatasync", gated)
        i = len(modes)
        while True:                 # inline turns, up to the probe: the thread takes it and is held
            lg.append(batch(i), epoch=1)
            i += 1
            if not lg.sync_turn():
                break
        assert in_sync.wait(10)
        info = lg.append(batch(i), epoch=1)
        assert not lg.sync_turn(), "the thread is syncing: it goes on to this append itself"
        release.set()
        assert lg.wait_durable(info.last_offset, timeout=10)
        monkeypatch.setattr(os, "fdatasync", real)
        # The overlapped sync started the count over; the thread's next sync (of the append made during
        # it) counted one: INLINE_AFTER - 1 more turns go to the thread.
        modes = [turn(lg, i + 1 + k) for k in range(INLINE_AFTER)]
        assert modes == [False] * (INLINE_AFTER - 1) + [True]


def test_the_caller_may_rule_the_inline_sync_out(tmp_path) -> None:
    with Log.open(tmp_path / "n", CFG) as lg:
        lg.sync_once_per_turn()
        for i in range(INLINE_AFTER + 5):
            info = lg.append(batch(i), epoch=1)
            assert not lg.sync_turn(inline=False)
            assert lg.wait_durable(info.last_offset, timeout=10)
        assert turn(lg, INLINE_AFTER + 5), "allowed again: inline (the thread's syncs bought nothing)"


def test_a_failed_inline_sync_is_fatal_and_makes_nothing_durable(tmp_path) -> None:
    lg = Log.open(tmp_path / "f", CFG)
    try:
        lg.sync_once_per_turn()
        while not turn(lg, lg.end_offset):
            pass
        durable = lg.durable_offset
        lg.append(batch(99), epoch=1)
        # /dev/null takes the write, then fdatasync fails (EINVAL) as a dying disk's would (EIO)
        fd = os.open("/dev/null", os.O_WRONLY)
        os.dup2(fd, lg._segments[-1].fd)
        os.close(fd)
        assert lg.sync_turn(), "tried inline"
        assert lg.failure is not None and lg.durable_offset == durable
        with pytest.raises(LogFailedError):
            lg.wait_durable(lg.end_offset - 1, timeout=1)
        with pytest.raises(LogFailedError):
            lg.append(batch(100), epoch=1)
    finally:
        lg.close()
    with Log.open(tmp_path / "f", CFG) as again:
        assert again.end_offset >= durable
