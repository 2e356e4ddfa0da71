"""kill -9 of the kv leader under a stream of SDK writes and a watch, then restart of the killed node.

What must hold: the client follows the new leader and the writes go on; every acknowledged write is
readable afterwards; no write is applied twice (each writer puts 0, 1, 2... to its own key, one at a
time, so the key's history must list strictly increasing values, each acknowledged one at the offset
its acknowledgement gave; a retry applied twice would repeat a value); a watch that was served by
the killed node resumes elsewhere with no gap and no repeat; `epochlog status` shows the dead node
unreachable and the others' own views; the restarted node catches up.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field

from epochlog.client import AsyncClient, ClientError
from statemachines.state import KvState
from tests.support.nodes import ROOT, NodeCluster
from tests.support.wait import eventually

WRITERS = 4
BEFORE_KILL = 40     # acknowledgements before the kill
AFTER_KILL = 80      # acknowledgements after it


@dataclass
class Workload:
    acks: list[tuple[int, int, int, float, float]] = field(default_factory=list)  # writer, value, offset, sent, acked
    duplicates: int = 0    # retries answered with the first attempt's result (request id already applied)
    indeterminate: list[tuple[int, int, str]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def writer(self, client: AsyncClient, w: int, rng: random.Random) -> None:
        value = 0
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                result = await client.put(f"stream/{w}", b"%d" % value)
                self.acks.append((w, value, result.offset, sent, time.monotonic()))
                self.duplicates += result.duplicate
            except ClientError as exc:     # past the client's deadline: may or may not have committed
                self.indeterminate.append((w, value, str(exc)))
            value += 1
            if rng.random() < 0.2:
                await asyncio.sleep(rng.random() * 0.01)


def test_kill9_leader_mid_stream_then_restart_catches_up(node_cluster_factory, seed: int) -> None:
    cluster: NodeCluster = node_cluster_factory()
    cluster.start()
    rng = random.Random(seed)
    victim = cluster.leader("kv")
    print(f"kv leader {victim} will be killed")

    async def main() -> None:
        work = Workload()
        watched: list[int] = []
        async with AsyncClient(cluster.endpoints, timeout=15.0) as client, \
                AsyncClient([cluster.endpoint(victim)] + [e for e in cluster.endpoints
                                                          if e != cluster.endpoint(victim)]) as watcher:
            first = await client.put("stream/start", b"")
            stream = watcher.watch("stream/", from_offset=first.offset + 1)

            async def watch() -> None:
                async for event in stream:
                    watched.append(event.offset)
            watching = asyncio.ensure_future(watch())
            writers = [asyncio.ensure_future(work.writer(client, w, random.Random(rng.random())))
                       for w in range(WRITERS)]
            try:
                await eventually(lambda: len(work.acks) >= BEFORE_KILL, 15, "acks before the kill")
                assert watched, "the watch (served by the victim) saw nothing before the kill"
                killed = cluster.kill9(victim)
                acked_before = len(work.acks)
                await eventually(lambda: len(work.acks) >= acked_before + AFTER_KILL, 30, "acks after the kill")
                work.stop.set()
                await asyncio.wait_for(asyncio.gather(*writers), 20)
                resumed = min(acked for *_, sent, acked in work.acks if sent > killed)
                print(f"{len(work.acks)} acks ({acked_before} before the kill), {len(work.indeterminate)} "
                      f"indeterminate, {work.duplicates} answered as duplicates; the first write sent after the "
                      f"kill was acknowledged {resumed - killed:.2f}s after it")
                last = max(offset for _, _, offset, *_ in work.acks)
                await eventually(lambda: bool(watched) and watched[-1] >= last, 15, "the watch to reach the last ack")
            finally:
                work.stop.set()
                for task in (*writers, watching):
                    task.cancel()
                await asyncio.gather(*writers, watching, return_exceptions=True)
                await stream.aclose()

            new_leader = await asyncio.to_thread(cluster.leader, "kv")
            assert new_leader != victim

            # No repeat and no gap in the watch, across the node it was served by dying.
            assert watched == sorted(set(watched)), "the watch repeated or reordered events"
            acked_offsets = {offset for _, _, offset, *_ in work.acks}
            assert acked_offsets <= set(watched), f"the watch missed {sorted(acked_offsets - set(watched))[:10]}"

            # Every acknowledged write is there, once, at its offset; values never repeat.
            for w in range(WRITERS):
                history = await client.history(f"stream/{w}", limit=10_000)
                values = []
                for change in history:
                    assert isinstance(change.state, KvState)
                    values.append((int(change.state.value), change.offset))
                numbers = [v for v, _ in values]
                assert numbers == sorted(set(numbers)), f"writer {w}: a value was applied twice: {numbers}"
                at = dict(values)
                for writer, value, offset, *_ in work.acks:
                    if writer == w:
                        assert at.get(value) == offset, (
                            f"writer {w}: acked value {value} at offset {offset}, history has {at.get(value)}")
                latest = await client.get(f"stream/{w}")
                assert latest is not None and (int(latest.value), latest.version) == values[-1]

            # `epochlog status` while it is down: the others report themselves, the victim is unreachable.
            status = await asyncio.to_thread(cli_status, cluster, True)
            assert [n["reachable"] for n in status["nodes"]] == [i != victim for i in (1, 2, 3)]
            kv = next(g for g in status["groups"] if g["group"] == "kv")
            assert kv["leader"] == new_leader and kv["commit_offset"] >= last
            roles = {m["id"]: m["role"] for m in kv["members"]}
            assert roles[victim] == "unreachable" and roles[new_leader] == "leader", roles
            assert all(m["applied_offset"] is not None for m in kv["members"] if m["id"] != victim)

            # The killed node comes back and catches up with what was committed while it was down.
            await asyncio.to_thread(cluster.restart, victim)
            leader_view = await asyncio.to_thread(cluster.group_status, await asyncio.to_thread(cluster.leader, "kv"),
                                                  "kv")
            assert leader_view is not None
            commit = leader_view.commit_offset
            assert commit >= last
            started = time.monotonic()
            caught_up = await asyncio.to_thread(cluster.wait_applied, victim, "kv", commit, 30.0)
            print(f"node {victim} restarted and applied through {caught_up.applied_offset} (commit {commit}) "
                  f"{time.monotonic() - started:.2f}s after READY")
            async with AsyncClient([cluster.endpoint(victim)]) as on_victim:
                for w in range(WRITERS):
                    kv = await on_victim.get(f"stream/{w}", consistency="local", min_offset=commit)
                    latest = await client.get(f"stream/{w}")
                    assert kv is not None and latest is not None and kv.version == latest.version

    asyncio.run(asyncio.wait_for(main(), 90))


def cli_status(cluster: NodeCluster, down: bool) -> dict:  # type: ignore[type-arg]
    """`epochlog status --json`; it exits 1 when a member does not answer (`down`), else 0."""
    result = subprocess.run([sys.executable, "-m", "epochlog", "status", "--json", "--config", str(cluster.config_path),
                             "--timeout", "5"], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert result.returncode == (1 if down else 0), result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]

