"""How the native face writes replies, against a real `epochlog serve` process.

Issue 20: a single client's reply was written a loop turn after its call completed (queued for the
turn's flush, behind the Raft group's peer writes). Now the reply of the last request running on a
connection is written at once; replies of requests that complete together still share one frame
(one write), which is what this guards: writing every reply at once would cost a write per reply
under pipelining.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.support.nodes import NodeCluster
from tests.epochlog.node.raw import RawConnection

WRITES = 16


def test_pipelined_writes_share_reply_frames_and_a_lone_write_is_answered(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory(size=1)
    cluster.start()
    cluster.wait_leader("kv")
    conn = RawConnection(cluster.endpoint(1), timeout=15)
    conn.hello()
    assert conn.call(1, {"type": "write", "events": [{"type": "KvPut", "name": "reply/lone", "value": b"0"}]})[2] is None

    # One frame of 16 writes: they are proposed in one turn, committed in one entry and applied together.
    requests = [[100 + i, {"type": "write", "events": [{"type": "KvPut", "name": f"reply/{i}", "value": b"x"}]},
                 10_000] for i in range(WRITES)]
    conn.send({"type": "requests", "requests": requests})
    sizes: list[int] = []
    got: dict[int, list[object]] = {}
    while len(got) < WRITES:
        frame = conn.frame()
        assert frame is not None and frame.get("type") == "replies", frame
        sizes.append(len(frame["replies"]))
        for reply in frame["replies"]:
            got[reply[0]] = reply
    assert set(got) == {100 + i for i in range(WRITES)}
    assert all(reply[2] is None for reply in got.values()), got
    assert max(sizes) > 1, f"every reply had a frame of its own: {sizes}"
    conn.close()
