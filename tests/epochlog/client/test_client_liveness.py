"""Leaving a stopped or cut-off leader (issue 17, defect 2): SDK calls move to the new leader within their deadline.

Real `epochlog serve` processes (tests/support/nodes.py), stopped with SIGSTOP by the pid the test
started, or cut off from their peers by the partition proxy (tests/support/proxy.py) while their
client port still answers.

- The kv leader stopped (or isolated) for 8 s under writers whose calls (puts, and batches of 20 puts
  in one `commands` call) have 10 s: writes are acknowledged by the new leader well before the pause
  ends, no writer call fails and none lasts longer than its timeout plus a grace. A write sent
  to the stopped leader (the client's cached leader, connection open) is acknowledged elsewhere
  within its deadline and its `Attempts` record says it is in doubt; calls with a deadline shorter
  than the failover fail within it (plus a grace), connecting to the stopped node and the blocking
  Client included. Before the fix the first acknowledgement came at the end of the pause.
- A write refused before it could be proposed (a follower's not_leader, a connection that failed
  to open) is not in doubt.
- A leader that is slow (its followers' acknowledgements delayed) but still leads is waited for:
  the write is sent once, not again after each attempt's limit.
- One node: no ping on an idle connection nor on one whose replies keep coming; a slow call on a
  healthy node survives (its pings are answered); a stopped node's connection is declared dead
  (NoAnswerError, "no answer") long before the call's deadline.
- The blocking Client returns by its deadline even when its loop is stuck.

Timing bounds are generous (the machine is shared); the failover speed itself is bench/client_failover.py's.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
import warnings

from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
import pytest

from epochlog.api import messages as p
from epochlog.client import AsyncClient, Client, ClientError, DeadlineExceededError, NoAnswerError
from epochlog.client.connection import Connection
from epochlog.client.errors import UnavailableError
from eventlog.errors import from_code
from epochlog.client.retry import Attempts, Timing, fate_unknown
from epochlog.client.sync import WAIT_GRACE_S
from statemachines import events as ev
from statemachines.request_ids import uuid7
from tests.support.nodes import NodeCluster
from tests.support.ports import free_ports
from tests.support.wait import eventually

T = TypeVar("T")

PAUSE_S = 8.0
WRITER_TIMEOUT_S = 10.0
GRACE_S = 1.0          # a call's network grace (0.25 s) plus scheduling on a loaded machine
STRAGGLER_S = 0.2      # a reply received this soon after the fault was on its way before it


class Writers:
    """Writer tasks, one call at a time each: odd ones put, even ones send batches of 20 puts in one
    `commands` call. Acknowledgement times, failures and the longest call."""

    def __init__(self, endpoints: list[str], n: int) -> None:
        self.acks: list[float] = []
        self.failures: list[str] = []
        self.longest_s = 0.0
        self.stop = asyncio.Event()
        self.tasks = [asyncio.ensure_future(self._run(endpoints, w)) for w in range(n)]

    async def _run(self, endpoints: list[str], w: int) -> None:
        async with AsyncClient(endpoints, timeout=WRITER_TIMEOUT_S) as client:
            i = 0
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    if w % 2:
                        await client.put(f"liveness/{w}/{i % 8}", b"%d" % i)
                    else:
                        await client.commands([ev.KvPut(name=f"liveness/{w}/{j}", value=b"%d" % i) for j in range(20)])
                    self.acks.append(time.monotonic())
                except ClientError as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                self.longest_s = max(self.longest_s, time.monotonic() - started)
                i += 1

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks), WRITER_TIMEOUT_S + 5)


async def timed(what: Awaitable[T]) -> tuple[T | ClientError, float]:
    """What `what` returned or the ClientError it raised, and how long it took."""
    started = time.monotonic()
    try:
        result: T | ClientError = await what
    except ClientError as exc:
        result = exc
    return result, time.monotonic() - started




def _put(name: str, value: bytes) -> p.Write:
    return p.Write([ev.KvPut(name=name, value=value, request_id=uuid7())])


@pytest.mark.parametrize("fault", ["stop", "isolate"])
def test_writes_leave_a_stopped_or_isolated_kv_leader(node_cluster_factory: Callable[..., NodeCluster],
                                                      fault: str) -> None:
    cluster = node_cluster_factory(proxied=fault == "isolate")
    cluster.start()

    async def main() -> None:
        victim = await asyncio.to_thread(cluster.leader, "kv")
        follower = next(i for i in cluster.nodes if i != victim)
        writers = Writers(cluster.endpoints, 4)
        try:
            async with AsyncClient(cluster.endpoints, timeout=WRITER_TIMEOUT_S) as probe:
                await probe.put("liveness/warm", b"")
                assert probe._leaders.get("kv") == cluster.endpoint(victim), probe._leaders

                # Refused before it could be proposed: a dead address (not sent) and a follower's
                # not_leader, then the leader's answer: not in doubt.
                dead = f"127.0.0.1:{free_ports(1, random.Random())[0]}"
                async with AsyncClient([dead, cluster.endpoint(follower)], timeout=WRITER_TIMEOUT_S) as fresh:
                    clean = Attempts()
                    written = await fresh._call(_put("liveness/clean", b"c"), group="kv", leader=True, attempts=clean)
                    assert isinstance(written, p.Written) and written.results[0].ok
                    assert clean.sent >= 2 and not clean.in_doubt, clean

                await eventually(lambda: len(writers.acks) >= 100, 30, "100 acknowledged writes")
                assert not writers.failures, writers.failures[:3]
                if fault == "stop":
                    t0 = await asyncio.to_thread(cluster.pause, victim)
                else:
                    assert cluster.net is not None
                    await asyncio.to_thread(cluster.net.isolate, victim)
                    t0 = time.monotonic()
                try:
                    # Sent to the stopped (or cut-off) leader on the probe's open connection: answered
                    # elsewhere within its deadline, in doubt (its first attempt got no answer).
                    record = Attempts()
                    stuck, took = await timed(probe._call(_put("liveness/in-flight", b"x"), group="kv", leader=True,
                                                          attempts=record))
                    assert isinstance(stuck, p.Written) and stuck.results[0].ok, stuck
                    assert took <= WRITER_TIMEOUT_S + GRACE_S, took
                    assert record.in_doubt and record.sent >= 2, record
                    moved = time.monotonic() - t0

                    # Deadlines shorter than the failover: the calls fail, in time, on the victim alone.
                    async with AsyncClient([cluster.endpoint(victim)], timeout=0.5) as hasty:
                        failed, took = await timed(hasty.put("liveness/hasty", b"h"))
                        assert isinstance(failed, ClientError), failed
                        assert took <= 0.5 + GRACE_S, (took, failed)
                        failed, took = await timed(hasty.get("liveness/hasty"))
                        assert isinstance(failed, ClientError) and took <= 0.5 + GRACE_S, (took, failed)

                    def blocking() -> tuple[BaseException | None, float]:
                        started = time.monotonic()
                        try:
                            with Client([cluster.endpoint(victim)], timeout=0.5) as client:
                                client.put("liveness/blocking", b"b")
                        except ClientError as exc:
                            return exc, time.monotonic() - started
                        return None, time.monotonic() - started
                    error, took = await asyncio.to_thread(blocking)
                    assert error is not None and took <= 0.5 + GRACE_S + WAIT_GRACE_S, (took, error)

                    await eventually(lambda: time.monotonic() >= t0 + PAUSE_S, PAUSE_S + 1, "the end of the pause")
                finally:
                    if fault == "stop":
                        cluster.resume(victim)
                    else:
                        assert cluster.net is not None
                        await asyncio.to_thread(cluster.net.heal)
                after = [t - t0 for t in writers.acks if t > t0 + STRAGGLER_S]
                print(f"{fault} of node {victim} for {PAUSE_S:.0f} s: the write sent to it was acknowledged "
                      f"{moved:.2f} s after the fault; writers' first ack after it at "
                      f"{min(after, default=float('nan')):.2f} s, {sum(1 for t in after if t < PAUSE_S)} acks during it")
                assert after and min(after) < PAUSE_S - 2, f"no write acknowledged well before the pause ended: {after[:3]}"
                assert moved < PAUSE_S - 2, moved
                got = await probe.get("liveness/in-flight")
                assert got is not None and got.value == b"x"
        finally:
            await writers.finish()
        assert not writers.failures, f"{len(writers.failures)} writer calls failed: {writers.failures[:3]}"
        assert writers.longest_s <= WRITER_TIMEOUT_S + GRACE_S, writers.longest_s

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_slow_leader_is_waited_for_not_sent_the_write_twice(node_cluster_factory: Callable[..., NodeCluster]) -> None:
    """The followers' messages reach the kv leader 1.5 s late (its heartbeats reach them on time, and the
    delay grows in steps shorter than an election timeout, so the leader keeps hearing from a quorum and
    keeps leading): every write takes longer than an attempt's limit (1 s), and the SDK, told by the
    node that it still leads, waits for the one attempt instead of sending the write again."""
    cluster = node_cluster_factory(proxied=True)
    cluster.start()
    delay_s = 1.5

    async def main() -> None:
        leader = await asyncio.to_thread(cluster.leader, "kv")
        assert cluster.net is not None
        async with AsyncClient(cluster.endpoints, timeout=WRITER_TIMEOUT_S) as client:
            await client.put("liveness/slow-warm", b"")
            assert client.timing.attempt_s < delay_s
            followers = [i for i in cluster.nodes if i != leader]
            try:
                for step in range(1, 11):
                    for follower in followers:
                        await asyncio.to_thread(cluster.net.delay, follower, leader, delay_s * step / 10)
                    await asyncio.sleep(0.25)
                record = Attempts()
                written, took = await timed(client._call(_put("liveness/slow", b"s"), group="kv", leader=True,
                                                         attempts=record))
            finally:
                await asyncio.to_thread(cluster.net.heal)
            assert isinstance(written, p.Written) and written.results[0].ok, written
            assert took >= delay_s, took
            assert record.sent == 1 and not record.in_doubt, record
            info = await asyncio.to_thread(cluster.group_status, leader, "kv")
            assert info is not None and info.role == "leader", "the leader lost its leadership: no slow leader tested"
            print(f"a write on a leader whose acknowledgements arrive {delay_s} s late took {took:.2f} s, one attempt")

    asyncio.run(asyncio.wait_for(main(), 60))


def test_pings_only_while_a_call_waits_in_silence_and_a_stopped_node_is_declared_dead(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory(size=1)
    cluster.start()

    async def main() -> None:
        conn = Connection(cluster.endpoint(1))
        await conn.connect(5)
        try:
            assert conn.timing == Timing(0.5)   # told in the hello: 10 ticks of 50 ms
            timing = conn.timing

            async def serves_linearizable_reads() -> bool:
                try:
                    await conn.call(p.Get("kv/x", "linearizable"), 2)
                except ClientError:
                    return False
                return True
            await eventually(serves_linearizable_reads, 15, "the single node to lead kv")

            await asyncio.sleep(3 * timing.ping_after_s)                        # idle
            busy_until = time.monotonic() + 4 * timing.ping_after_s             # replies keep coming
            while time.monotonic() < busy_until:
                await conn.call(p.Get("kv/x", "local"), 2)
            assert conn.pings_sent == 0

            # A slow call on a healthy node: pinged, answered, kept; it ends with the node's own answer.
            with pytest.raises(DeadlineExceededError):
                await conn.call(p.Get("kv/x", "local", min_offset=10**9), 4 * timing.ping_after_s + 1)
            assert conn.pings_sent >= 2 and conn.open, conn.pings_sent

            stopped = await asyncio.to_thread(cluster.pause, 1)
            try:
                error, took = await timed(conn.call(p.Get("kv/x", "linearizable"), 30))
                assert isinstance(error, NoAnswerError) and "no answer" in str(error), error
                assert took <= timing.ping_after_s + timing.ping_timeout_s + GRACE_S + 1, took
                assert not conn.open
                print(f"the stopped node's connection was declared dead {time.monotonic() - stopped:.2f} s after "
                      f"SIGSTOP: {error}")
            finally:
                cluster.resume(1)
        finally:
            await conn.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_blocking_client_returns_by_its_deadline_even_when_its_loop_is_stuck(
        caplog: pytest.LogCaptureFixture) -> None:
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.ERROR, logger="asyncio"):
        warnings.simplefilter("always")
        with Client(["127.0.0.1:1"], timeout=0.5) as client:
            client._loop.call_soon_threadsafe(time.sleep, 3.0)   # the client's loop thread does nothing else meanwhile
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError):
                client.status()
            took = time.monotonic() - started
            assert 0.5 <= took <= 0.5 + WAIT_GRACE_S + GRACE_S, took
        gc.collect()
    # Closing after the stuck loop came back ends what it had not started (close's own call) rather
    # than dropping it: no coroutine left never awaited, no task destroyed while pending.
    assert not [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert not [r.getMessage() for r in caplog.records if "destroyed but it is pending" in r.getMessage()]


def test_which_failures_leave_a_write_in_doubt() -> None:
    refused = [from_code("not_leader", "not the leader"), from_code("disk_full", "full"),
               from_code("invalid_argument", "bad")]
    unknown = [NoAnswerError("silent"), UnavailableError("connection closed"), DeadlineExceededError("late"),
               from_code("proposal_dropped", "dropped"), from_code("group_halted", "halted"),
               asyncio.CancelledError()]
    assert [fate_unknown(e) for e in refused] == [False] * len(refused)
    assert [fate_unknown(e) for e in unknown] == [True] * len(unknown)
    record = Attempts()
    record.settle(refused[0])
    assert not record.in_doubt
    record.settle(None)
    record.settle(unknown[0])
    assert record.in_doubt


def test_a_node_that_does_not_tell_its_election_timeout_gets_the_default() -> None:
    old = msgspec.msgpack.encode({"type": "server_hello", "version": 1, "cluster": "c", "node": 1, "error": ""})
    hello = msgspec.msgpack.decode(old, type=p.ServerHello)
    assert hello.election_timeout_ms == 0
    assert Timing.from_hello(hello.election_timeout_ms) == Timing(1.0)
    assert Timing.from_hello(500).attempt_s == 1.0 and Timing.from_hello(2000).attempt_s == 4.0
