"""Exactly once on real `epochlog serve` nodes: a write retried however late is applied at most once.

The defect (issue 17): a put sent to the kv leader just before it was cut off was committed by the new
leader, overwritten by later writes, and applied AGAIN when the SDK's retry reached the new leader,
because request ids were remembered only above the history floor, which had moved past the first
application meanwhile (short retention). These tests replay that retry deterministically: the first
attempt commits, its answer is treated as lost, the history floor moves past it (retention of 150
offsets, snapshots every 100), leadership moves, and the very same request arrives again:

1. a request id without a session (a UUIDv7) is answered with the first outcome, not applied twice
   (this test applied the put twice before the fix); a request id that carries no time is refused;
2. a request of a client session likewise, across a leader change and on a member that installed a
   snapshot (the session's outcomes travel in the snapshot);
3. a session that expired refuses the retry (`session_expired`) and changes nothing; the SDK re-opens a
   session by itself for a write that is not in doubt, and raises OutcomeUnknownError for one that is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

import pytest

from epochlog.client import Client, OutcomeUnknownError
from statemachines import events as ev
from statemachines import views_format
from statemachines.request_ids import uuid7
from statemachines.sessions import SESSION_EXPIRED
from tests.support.nodes import NodeCluster
from tests.support.wait import wait_until
from tests.epochlog.node.raw import RawConnection

pytestmark = pytest.mark.timeout(300)

SHORT_RETENTION = {"retain_offsets": 150, "check_interval_ms": 100, "prune_interval_ms": 20,
                   "compact_groups": []}   # kv truncated: a member that was down installs a snapshot


def raw_write(address: str, events: list[dict[str, Any]]) -> list[Any]:
    """One native-protocol `write`, as a client that builds its own requests would send it: the results."""
    conn = RawConnection(address)
    try:
        conn.hello()
        reply = conn.call(1, {"type": "write", "events": events})
    finally:
        conn.close()
    assert reply[2] is None, f"write failed: {reply[2]}"
    return list(reply[1]["results"])


def as_dict(event: ev.Event) -> dict[str, Any]:
    return msgspec.to_builtins(event, builtin_types=(bytes,))   # type: ignore[no-any-return]


def kv_floor(cluster: NodeCluster, node_id: int) -> int:
    with Client([cluster.endpoint(node_id)], timeout=5.0) as c:
        info = c.compaction_status(cluster.endpoint(node_id))
    return next(g.history_floor for g in info.groups if g.group == "kv")


def overwrite_past_the_floor(cluster: NodeCluster, key: str, first_offset: int) -> bytes:
    """Later writes of `key` (and others) until every running member's kv history floor is past
    `first_offset`; the key's last value."""
    last = b""
    with Client(cluster.endpoints, timeout=30.0) as client:
        for i in range(12):
            last = f"later-{i}".encode()
            client.commands([ev.KvPut(name=key, value=last)] +
                            [ev.KvPut(name=f"eo/filler/{j}", value=b"%d" % i) for j in range(49)])
        for n in cluster.running():
            wait_until(lambda n=n: kv_floor(cluster, n) > first_offset, 60,
                       f"node {n}'s kv history floor past offset {first_offset}")
    return last


def test_a_late_retry_of_a_request_id_is_answered_never_applied_twice(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory(snapshot_every_entries=100, log={"segment_bytes": 32 << 10},
                                   views={"dedupe_window_offsets": 200}, compaction=SHORT_RETENTION)
    cluster.start()
    leader = cluster.leader("kv")
    put = as_dict(ev.KvPut(name="eo/rid", value=b"first", actor="qa", request_id=uuid7()))
    (first,) = raw_write(cluster.endpoint(leader), [put])      # applied; say its answer was lost
    assert first[2], first
    last = overwrite_past_the_floor(cluster, "eo/rid", first[0])
    with Client(cluster.endpoints, timeout=20.0) as client:
        client.transfer_leader("kv")
        new_leader = cluster.leader("kv", among=[n for n in cluster.nodes if n != leader])
        (retry,) = raw_write(cluster.endpoint(new_leader), [put])   # the retry, much later, elsewhere
        assert retry[0] == first[0] and retry[5], f"the retry was applied again: {retry} (first {first})"
        got = client.get("eo/rid")
        assert got is not None and got.value == last and got.version != retry[0]
        assert [c.offset for c in client.history("eo/rid") if c.offset == first[0]] == [], \
            "below the floor, as the scenario needs"
    # A request id that carries no time could not be judged that late: refused before anything is appended.
    conn = RawConnection(cluster.endpoint(new_leader))
    try:
        conn.hello()
        reply = conn.call(2, {"type": "write", "events": [{**put, "request_id": "retry-me"}]})
    finally:
        conn.close()
    assert reply[2] is not None and reply[2][0] == "invalid_argument" and "UUIDv7" in reply[2][1], reply


def test_a_session_retry_across_a_leader_change_and_a_snapshot_install_gets_the_first_outcome(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory(snapshot_every_entries=100, log={"segment_bytes": 32 << 10},
                                   compaction=SHORT_RETENTION)
    cluster.start()
    leader = cluster.leader("kv")
    lagging = next(n for n in cluster.nodes if n != leader)
    (opened,) = raw_write(cluster.endpoint(leader), [as_dict(ev.ClientSessionOpened(group="kv", client="qa/1"))])
    session = opened[0] + 1
    request = as_dict(ev.KvPut(name="eo/session", value=b"first", session_id=session, seq=1, answered_below=1,
                               v=ev.SESSIONS_SCHEMA))
    (first,) = raw_write(cluster.endpoint(leader), [request])
    assert first[2], first
    cluster.kill9(lagging)                         # misses everything below: it will install a snapshot
    last = overwrite_past_the_floor(cluster, "eo/session", first[0])
    cluster.restart(lagging)
    with Client(cluster.endpoints, timeout=20.0) as client:
        commit = next(g.commit_offset for g in client.status(cluster.endpoint(leader)).groups if g.group == "kv")
        info = cluster.wait_applied(lagging, "kv", commit, timeout=60)
        assert info.log_start > first[0], f"node {lagging} caught up by log, not by snapshot: {info}"
        wait_until(lambda: _transfer_to(client, cluster, lagging), 60, f"kv leadership on node {lagging}")
        (retry,) = raw_write(cluster.endpoint(lagging), [request])
        assert retry[0] == first[0] and retry[5] and retry[2], f"not the first outcome: {retry} (first {first})"
        got = client.get("eo/session")
        assert got is not None and got.value == last


def test_a_batch_of_session_requests_retried_after_the_leader_is_killed_gets_each_first_outcome(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    """At views format level 3 a write of consecutive requests of a session is kept as one outcome row
    (a run, statemachines/sessions.py): after the leader is killed, the new leader answers each retried
    request, the whole batch, a request from its middle and one out of order, with its own first offset,
    and applies none of them again; the requests after them go on extending and forgetting runs."""
    cluster = node_cluster_factory()
    cluster.start()
    cluster.wait_views_format(views_format.LATEST)
    assert views_format.LATEST >= views_format.OUTCOME_RUNS
    leader = cluster.leader("kv")
    (opened,) = raw_write(cluster.endpoint(leader), [as_dict(ev.ClientSessionOpened(group="kv", client="qa/run"))])
    session = opened[0] + 1

    def batch(seqs: list[int], value: bytes, below: int) -> list[dict[str, Any]]:
        return [as_dict(ev.KvPut(name=f"eo/run/{seq}", value=value, session_id=session, seq=seq,
                                 answered_below=below, v=ev.SESSIONS_SCHEMA)) for seq in seqs]

    first = raw_write(cluster.endpoint(leader), batch(list(range(1, 31)), b"first", 1))
    assert all(r[2] and not r[5] for r in first), first
    offsets = [r[0] for r in first]
    assert offsets == list(range(offsets[0], offsets[0] + 30)), "one entry: consecutive offsets, one run"
    cluster.kill9(leader)                            # the answers are lost with it, say
    new_leader = cluster.leader("kv", among=[n for n in cluster.nodes if n != leader], timeout=30.0)
    retried = raw_write(cluster.endpoint(new_leader), batch(list(range(1, 31)), b"again", 1))
    assert [(r[0], r[2], r[5]) for r in retried] == [(o, True, True) for o in offsets], retried
    (middle, late) = raw_write(cluster.endpoint(new_leader), batch([17, 3], b"again", 1))
    assert (middle[0], middle[5]) == (offsets[16], True) and (late[0], late[5]) == (offsets[2], True)
    # Requests 1-10 answered: the run is cut; the next requests go on; 12 retried answers its own offset.
    more = raw_write(cluster.endpoint(new_leader), batch(list(range(31, 41)), b"more", 11))
    assert all(r[2] and not r[5] for r in more), more
    (twelve,) = raw_write(cluster.endpoint(new_leader), batch([12], b"again", 11))
    (five,) = raw_write(cluster.endpoint(new_leader), batch([5], b"again", 5))
    assert (twelve[0], twelve[5]) == (offsets[11], True), twelve
    assert not five[2] and five[3] == SESSION_EXPIRED, five
    with Client([cluster.endpoint(new_leader)], timeout=20.0) as client:
        assert [client.get(f"eo/run/{seq}").value for seq in (1, 12, 17, 30)] == [b"first"] * 4  # type: ignore[union-attr]
        assert client.get("eo/run/40").value == b"more"   # type: ignore[union-attr]


def _transfer_to(client: Client, cluster: NodeCluster, target: int) -> bool:
    if cluster.leader("kv") == target:
        return True
    try:
        client.transfer_leader("kv", target)
    except Exception:   # noqa: BLE001 - a transfer in progress or a leader change: try again
        pass
    return cluster.leader("kv") == target


def test_an_expired_session_refuses_the_retry_and_the_sdk_reopens_for_a_new_write(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    cluster = node_cluster_factory(views={"client_session_timeout_ms": 1_000})
    cluster.start()
    leader = cluster.leader("kv")
    (opened,) = raw_write(cluster.endpoint(leader), [as_dict(ev.ClientSessionOpened(group="kv", client="qa/2"))])
    request = as_dict(ev.KvPut(name="eo/expired", value=b"first", session_id=opened[0] + 1, seq=1,
                               answered_below=1, v=ev.SESSIONS_SCHEMA))
    (first,) = raw_write(cluster.endpoint(leader), [request])
    with Client(cluster.endpoints, timeout=20.0) as client:
        # Committed time moves with the entries (their leader timestamps): another write, 1.5 s later.
        time.sleep(1.5)
        client.put("eo/expired", b"second")
        (retry,) = raw_write(cluster.endpoint(cluster.leader("kv")), [request])
        assert not retry[2] and retry[3] == SESSION_EXPIRED, retry
        got = client.get("eo/expired")
        assert got is not None and got.value == b"second", "the refused retry changed nothing"
        # The SDK's own session expires too while it idles; its next write is not in doubt: re-opened.
        sdk = Client(cluster.endpoints, timeout=20.0)
        try:
            sdk.put("eo/sdk", b"1")
            time.sleep(1.5)
            client.put("eo/tick", b"y")   # committed time passes the SDK session's deadline
            again = sdk.put("eo/sdk", b"2")
            assert again.ok and sdk.get("eo/sdk").value == b"2"   # type: ignore[union-attr]
        finally:
            sdk.close()



def test_an_in_doubt_write_whose_session_expired_is_outcome_unknown_and_never_resent(
        node_cluster_factory: Callable[..., NodeCluster]) -> None:
    """The SDK's rule: a write whose attempt got no answer (sent to a leader that stopped) and whose
    session expired before the retry could learn its fate raises OutcomeUnknownError; it is not sent
    again under a new session, so it is applied nowhere here (the stopped leader never proposed it)."""
    cluster = node_cluster_factory(views={"client_session_timeout_ms": 1_000})
    cluster.start()
    leader = cluster.leader("kv")
    client = Client(cluster.endpoints, timeout=20.0)
    try:
        client.put("eo/doubt/warm", b"1")            # opens the session; the leader is now known
        time.sleep(1.5)                               # the session's deadline passes: any later entry expires it
        cluster.pause(leader)
        try:
            with pytest.raises(OutcomeUnknownError, match="may or may not have been applied"):
                client.put("eo/doubt/x", b"lost?")
        finally:
            cluster.resume(leader)
        assert client.get("eo/doubt/x") is None, "the in-doubt write was not re-sent under a new session"
        assert client.put("eo/doubt/x", b"again").ok  # the client goes on with a new session
    finally:
        client.close()
