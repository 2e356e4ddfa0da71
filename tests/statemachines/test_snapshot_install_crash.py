"""A follower killed between installing a snapshot in its log and restoring its views from it.

On a real 3-node cluster (two NodeHosts in this process, over real TCP, with real logs and RocksDB
views), the third node starts far behind the leader's log start, in a child process
(`crash_child.py follower`) whose views SIGKILL the process the moment the group asks them to
restore the snapshot it received: the log storage has installed it (renamed into place, log reset
behind it), the views are still empty. The node is then started again, normally, and must:

- not fail (before the fix, its group stopped with "gap: entry S+1 after applied offset -1": the
  log resumed after the snapshot while the views were still behind it, and nothing could repair
  that; NodeHost.start now restores the views from the installed snapshot first);
- reach the leader's applied offset with the same views digest and byte-identical column families;
- keep equal digests at later offsets, across a restart of the leader in the middle of the writes.

Replay: EPOCHLOG_VIEWS_CRASH_SEED=<seed printed> (the ports and payloads; timing is real).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from statemachines import events as ev
from statemachines.state import Outcome
from statemachines.views import ViewsStateMachine
from tests.support.hosts import GROUP, HostCluster, views
from tests.support.ports import free_ports
from tests.support.wait import eventually
from tests.statemachines.test_crash import dump, first_difference

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT_EVERY = 200


def _seed() -> int:
    env = os.environ.get("EPOCHLOG_VIEWS_CRASH_SEED")
    return int(env) if env else random.SystemRandom().getrandbits(32)


async def write(nodes: HostCluster, rng: random.Random, tag: str, batches: int, timeout: float = 10.0) -> Outcome:
    """`batches` batches of puts and deletes through whoever leads (retrying across a leader change)."""
    last: Outcome | None = None
    for i in range(batches):
        records = [ev.event_record(ev.KvPut(name=f"{tag}/{rng.randrange(300)}",
                                            value=rng.randbytes(rng.randrange(200))))
                   for _ in range(15)]
        records.append(ev.event_record(ev.KvDeleted(name=f"{tag}/{rng.randrange(300)}")))
        deadline = time.monotonic() + timeout
        while True:
            leader = await nodes.leader()
            try:
                committed = await asyncio.wait_for(leader.submit(records), 5)
                break
            except Exception:   # noqa: BLE001 - a leader change: retry through the new leader
                assert time.monotonic() < deadline, f"batch {i} of {tag} never committed"
                await asyncio.sleep(0.05)
        last = committed.outcomes[-1]  # type: ignore[assignment]
    assert last is not None
    return last


async def same_views_at(nodes: HostCluster, offset: int, ctx: str) -> bytes:
    """Every running node reaches `offset` exactly (no writes meanwhile): equal digests and CFs."""
    await asyncio.gather(*(nodes.group(n).wait_applied(offset, 20) for n in nodes.hosts))
    sms = {n: views(nodes.group(n)) for n in nodes.hosts}
    assert {sm.applied_index for sm in sms.values()} == {offset}, (
        ctx, {n: s.applied_index for n, s in sms.items()})
    digests = {n: sm.digest for n, sm in sms.items()}
    assert len(set(digests.values())) == 1, f"{ctx}: digests differ at {offset}: {digests}"
    dumps = {n: dump(sm) for n, sm in sms.items()}
    first = next(iter(dumps))
    for n, d in dumps.items():
        assert d == dumps[first], (
            f"{ctx}: node {n} vs {first} at {offset}: {first_difference(d, dumps[first])}")
    return next(iter(digests.values()))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_follower_killed_between_snapshot_install_and_views_restore_recovers(tmp_path: Path) -> None:
    seed = _seed()
    print(f"\nsnapshot-install crash test seed={seed} (replay: EPOCHLOG_VIEWS_CRASH_SEED={seed})")
    rng = random.Random(seed)
    ports = free_ports(3, rng)
    nodes = HostCluster(tmp_path, ports=ports, snapshot_every_entries=SNAPSHOT_EVERY)
    proc: subprocess.Popen[bytes] | None = None

    async def scenario() -> None:
        nonlocal proc
        await nodes.start(1)
        await nodes.start(2)
        last = await write(nodes, rng, "a", 60)     # 60 x 16 records: snapshots at every 200, log compacted
        leader = await nodes.leader()
        assert leader.storage.log.start_offset > 0, "the leader's log was not compacted: no snapshot install"

        # Node 3 starts far behind, in a child whose views die when asked to restore the snapshot.
        err = open(tmp_path / "follower.stderr", "w+b")
        proc = subprocess.Popen([sys.executable, "-m", "tests.statemachines.crash_child", "follower", "3",
                                 str(tmp_path / "n3"), ",".join(map(str, ports)), str(SNAPSHOT_EVERY)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
        await eventually(lambda: proc.poll() is not None, 30, "the follower to be asked to restore a snapshot")
        assert proc.stdout is not None
        out = proc.stdout.read().decode()
        err.seek(0)
        stderr = err.read().decode(errors="replace")
        err.close()
        assert proc.returncode == -signal.SIGKILL, f"rc={proc.returncode}\n{out}\n{stderr}"
        restore_line = [line for line in out.splitlines() if line.startswith("RESTORE")]
        assert restore_line, out
        index = int(restore_line[0].split()[1])

        # What the kill left: the snapshot installed in the log storage, the views still empty.
        group_dir = tmp_path / "n3" / "groups" / GROUP
        snapshots = sorted(p.name for p in (group_dir / "snapshots").iterdir())
        assert any(name.startswith(f"{index}-") for name in snapshots), (
            f"snapshot {index} is not installed in the log storage: {snapshots}")
        sm = ViewsStateMachine(group_dir)
        assert sm.applied_index < index, (
            "the views were not behind the installed snapshot: the test missed the window")
        sm.close()

        # Restarted normally, node 3 restores from the installed snapshot and catches up.
        await nodes.start(3)
        g3 = nodes.group(3)
        await g3.wait_applied(last.offset, 20)
        assert g3.failed is None, g3.failed
        assert views(g3).applied_index >= index
        await same_views_at(nodes, last.offset, "after the restart")

        # Digests stay equal at later offsets, across a leader restart in the middle of the writes.
        offsets = [last.offset]
        for round_no in range(3):
            last = await write(nodes, rng, f"b{round_no}", 10)
            leader = await nodes.leader()
            stopped = leader.node_id
            await nodes.stop(stopped)
            last = await write(nodes, rng, f"c{round_no}", 10)
            await nodes.start(stopped)
            await same_views_at(nodes, last.offset, f"round {round_no}, node {stopped} restarted")
            offsets.append(last.offset)
        assert all(nodes.group(n).failed is None for n in nodes.hosts)
        print(f"equal views on all three nodes at offsets {offsets}; node 3 killed in the restore of {index}")

    async def main() -> None:
        try:
            await scenario()
        finally:
            await nodes.close()

    try:
        asyncio.run(asyncio.wait_for(main(), 100))
    finally:
        if proc is not None:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)   # only the pid this test started
                proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
