"""The load `epochlog up --demo-load` puts on the cluster through the SDK, so its status shows traffic.

Every group gets some: kv puts (`demo/keys/<run>-<n>`, about PUTS_PER_S), consumer-offset commits
(offsets group), one topic created or updated per run (metadata group), and a lease kept alive while
the load runs, holding the key `demo/sessions/run-<run>` (it disappears TTL after the load stops). A
watch on the run's keys counts what it sees.

Each run numbers itself through a compare-and-set on `demo/runs` and first counts the keys earlier
runs left: on a restarted cluster that count shows the data resumed from disk. Use from one loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from epochlog.client import AsyncClient, ClientError, RejectedError
from statemachines import events as ev

PUTS_PER_S = 100.0
BATCH = 10
LEASE_TTL_MS = 5000
TOPIC = "demo-orders"


@dataclass
class DemoReport:
    run: int = 0
    earlier_keys: int = 0
    puts: int = 0
    last_key: str = ""
    last_offset: int = -1
    offset_commits: int = 0
    lease_id: int = 0
    keepalives: int = 0
    watched: int = 0
    read_back: bool = False
    errors: int = 0
    last_error: str = ""

    def lines(self) -> list[str]:
        out = [f"demo load, run {self.run}: {self.puts} puts (demo/keys/{self.run}-*, last at offset "
               f"{self.last_offset}), {self.offset_commits} offset commits, topic {TOPIC} written, "
               f"lease {self.lease_id:#x} (ttl {LEASE_TTL_MS} ms) kept alive {self.keepalives} times",
               f"demo load, run {self.run}: the watch on demo/keys/{self.run}- saw {self.watched} of "
               f"{self.puts} puts; last key read back: {self._read_back()}; "
               f"keys from earlier runs: {self.earlier_keys}"]
        if self.errors:
            out.append(f"demo load, run {self.run}: {self.errors} calls failed (last: {self.last_error})")
        return out

    def problems(self) -> list[str]:
        """What went wrong that should not on a healthy cluster (the run's exit code reflects it)."""
        out = []
        if self.puts and not self.read_back:
            out.append(f"demo load: the last key written ({self.last_key}) did not read back as written")
        if self.watched != self.puts and not self.errors:
            out.append(f"demo load: the watch saw {self.watched} events for {self.puts} puts")
        return out

    def _read_back(self) -> str:
        if not self.last_key:
            return "nothing written"
        return "ok" if self.read_back else "MISMATCH"


class DemoLoad:
    """Writes until `stop` is set, then reports what it did (through `say`, and as a DemoReport)."""

    def __init__(self, endpoints: Sequence[str], say: Callable[[str], None], *,
                 puts_per_s: float = PUTS_PER_S) -> None:
        self.endpoints = list(endpoints)
        self.say = say
        self.puts_per_s = puts_per_s
        self.report = DemoReport()

    async def run(self, stop: asyncio.Event) -> DemoReport:
        r = self.report
        client = AsyncClient(self.endpoints, timeout=5.0, actor="epochlog-up-demo", name="epochlog-demo-load")
        async with client as c:
            runs = await c.get("demo/runs")
            r.run = 1 if runs is None else int(runs.value) + 1
            # Compare-and-set: two runs never take the same number.
            await c.put("demo/runs", str(r.run).encode(), expected_version=runs.version if runs else 0)
            async for _ in c.scan("demo/keys/"):
                r.earlier_keys += 1
            try:
                await c.command(ev.TopicCreated(name=TOPIC, read_queues=4, write_queues=4))
            except RejectedError:
                await c.command(ev.TopicUpdated(name=TOPIC, config={"last_demo_run": str(r.run)}))
            lease = await c.lease_grant(LEASE_TTL_MS)
            r.lease_id = lease.lease_id
            held = await c.put(f"demo/sessions/run-{r.run}", b"held by the demo's lease",
                               lease=lease.lease_id)
            self.say(f"demo load, run {r.run}: {r.earlier_keys} keys from earlier runs found; writing "
                     f"~{self.puts_per_s:.0f} puts/s, offset commits, lease {lease.lease_id:#x}, watch on "
                     f"demo/keys/{r.run}-")
            prefix = f"demo/keys/{r.run}-"
            watch = asyncio.get_running_loop().create_task(self._watch(c, prefix, held.offset + 1))
            try:
                await self._write(c, stop)
                deadline = time.monotonic() + 3.0
                while r.watched < r.puts and time.monotonic() < deadline and not watch.done():
                    await asyncio.sleep(0.05)
            finally:
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
            if r.last_key:
                got = await c.get(r.last_key)
                r.read_back = got is not None and got.value == _value(r.run, r.puts - 1)
        for line in r.lines():
            self.say(line)
        return r

    async def _write(self, c: AsyncClient, stop: asyncio.Event) -> None:
        r = self.report
        period = BATCH / self.puts_per_s
        next_keepalive = time.monotonic() + 1.0
        while not stop.is_set():
            started = time.monotonic()
            n0 = r.puts
            keys = [f"demo/keys/{r.run}-{n0 + i:06d}" for i in range(BATCH)]
            results = await asyncio.gather(*(c.put(k, _value(r.run, n0 + i)) for i, k in enumerate(keys)),
                                           c.command(ev.OffsetCommitted(consumer_group="demo", topic=TOPIC,
                                                                        queue_id=r.offset_commits % 4,
                                                                        offset=r.offset_commits)),
                                           return_exceptions=True)
            for i, result in enumerate(results):
                if isinstance(result, BaseException):
                    if not isinstance(result, ClientError):
                        raise result
                    r.errors += 1
                    r.last_error = str(result)
                elif i == BATCH:
                    r.offset_commits += 1
                else:
                    r.last_offset = max(r.last_offset, result.offset)
            # Keys stay numbered densely only if the whole batch committed; a failed put is retried
            # under the same number by the next batch (the SDK's request ids are per call).
            done = 0
            while done < BATCH and not isinstance(results[done], BaseException):
                done += 1
            r.puts += done
            if done:
                r.last_key = keys[done - 1]
            if time.monotonic() >= next_keepalive:
                try:
                    await c.lease_keepalive(r.lease_id)
                    r.keepalives += 1
                except ClientError as exc:
                    r.errors += 1
                    r.last_error = str(exc)
                next_keepalive = time.monotonic() + 1.0
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, period - (time.monotonic() - started)))
            except TimeoutError:
                pass

    async def _watch(self, c: AsyncClient, prefix: str, from_offset: int) -> None:
        async for event in c.watch(prefix, from_offset=from_offset):
            if event.applied is not False:   # a put retried after a lost reply is committed twice, applied once
                self.report.watched += 1


def _value(run: int, n: int) -> bytes:
    return f"run {run} put {n}".encode()
