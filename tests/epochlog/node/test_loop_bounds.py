"""No request from outside stalls the loop that keeps Raft alive (issue 18), against 3 real nodes.

Every Raft group of a node, its native and Kafka faces share one asyncio loop: a request that holds
it for seconds delays every group's heartbeats past the election timeout, the followers elect, and
repeated, the cluster keeps electing. Found from outside on 4260cef, each moved every leadership off
the node: a Kafka Metadata request naming 200,000 topics (20.4 s of loop), a 200 KiB gzip batch that
inflates to 200 MiB before it is refused (9.3 s, RSS +386 MiB), one native frame of 100,000
pipelined gets (14.7 s); 5,000 JoinGroups for distinct groups were all kept, idle native
connections were not capped, and the Kafka face kept 3 x 90 MiB partial frames (+270 MiB).

Each of those is sent here to the node that leads every group, again and again for ATTACK_S
seconds (the 100,000 gets also as one frame of 10 get_many calls of 10,000 keys), and afterwards:

- no group changed its leader or term on any node (no election at all);
- the node itself never held its loop more than STALL_LIMIT_S (epochlog_loop_stall_own_seconds: how
  late the loop ran a timer, less the time its thread waited for a CPU, which on a loaded machine
  other processes take); and counting that wait, it never ran a timer more than WAIT_LIMIT_S late
  (epochlog_loop_stall_seconds): a leader's heartbeats were at most one tick plus that apart, below
  the 2-4 s a follower waits before it campaigns;
- the node's RSS (sampled from /proc during the attack) grew by less than the attack's bound;
- the node answered as its limits say (MESSAGE_TOO_LARGE, GROUP_MAX_SIZE_REACHED, connection_limit,
  a closed connection) and went on serving.

Robust on a loaded machine: the election timeout is 2 s (40 ticks of 50 ms), so a process that is
not scheduled for a few hundred ms does not lose its leaderships, and the stall bound (0.5 s) is a
quarter of it; with the limits, the longest stall measured here on a loaded 2-core machine (load
average 4) was 0.1 s, and 0.25 s at worst in the runs made while writing it. At load 5-17 one run saw
a stall of 0.5-1.0 s, before the node measured how much of a stall was its process waiting for a core;
the bound of 0.5 s is now on the node's own part, which leaves that wait out (in a run at load 4-9 the
pipelined gets' own part reached 0.25-0.5 s, their whole stalls the same). Checked against the
code before the limits (with the loop monitor added, and the limits' keys left out of the config),
each case fails: Metadata and the gzip bomb stall the loop up to 2.5 s (the bomb: RSS +400 MiB), the
pipelined gets up to 10 s and every leadership moves (RSS +527 MiB); 26,800 JoinGroups were all
kept, 600 idle connections all greeted, and the partial frames held RSS +255 MiB.
"""

from __future__ import annotations

import functools
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from kafka.protocol.consumer.group import JoinGroupRequest, JoinGroupResponse
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from epochlog.client import Client
from eventlog.records import HEADER, HEADER_SIZE, LOG_OVERHEAD, MAGIC, crc32c
from tests.epochlog.kafka.raw import RawKafka
from tests.support.nodes import NodeCluster
from tests.support.fixtures import seed_for
from tests.epochlog.node.raw import RawConnection, frame_bytes

pytestmark = pytest.mark.slow

ATTACK_S = 5.0      # one request of each kind stalled the loop 2.5-20 s before the limits (above), so the
                    # first repetition fails; 5 s still repeats each (every check below counts repeats;
                    # at load 4: 278 Metadata, 706 bombs, 20,600 refused JoinGroups, 1,500 refused connections)
TICK_MS = 50
ELECTION_TICKS = 40                      # a 2 s election timeout
STALL_LIMIT_S = 0.5                      # a bucket bound of epochlog_loop_stall_own_seconds
WAIT_LIMIT_S = 1.0                       # a bucket bound of epochlog_loop_stall_seconds
OWN = "epochlog_loop_stall_own_seconds"
assert TICK_MS / 1000 + STALL_LIMIT_S < ELECTION_TICKS * TICK_MS / 1000 / 2
assert TICK_MS / 1000 + WAIT_LIMIT_S < ELECTION_TICKS * TICK_MS / 1000
ATTACKED = 1
MAX_CONNECTIONS = 300                    # [clients] max_connections
MAX_GROUPS = 500                         # [kafka] max_groups
KAFKA_BUDGET = (100 << 20) + 4           # [kafka] partial_frames_bytes: its minimum, one frame of 100 MiB
KAFKA_FRAME_TIMEOUT_MS = 4_000
MIB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    """3 nodes; node ATTACKED leads every group."""
    made = NodeCluster(tmp_path_factory.mktemp("loop-bounds"), seed=seed_for(__name__), tick_interval_ms=TICK_MS,
                       raft={"election_timeout_ticks": ELECTION_TICKS}, clients={"max_connections": MAX_CONNECTIONS},
                       kafka=True, kafka_config={"max_groups": MAX_GROUPS, "partial_frames_bytes": KAFKA_BUDGET,
                                                 "frame_timeout_ms": KAFKA_FRAME_TIMEOUT_MS})
    try:
        made.start()
        with Client(made.endpoints, timeout=20) as client:
            client.put("loop/x", b"1")
        for group in made.groups:
            made.move_leader(group, ATTACKED, timeout=60)
        yield made
    finally:
        made.close()
        print(made.describe())


# --- what the node says ------------------------------------------------------------------------------

def _terms(cluster: NodeCluster) -> dict[tuple[int, str], tuple[int, int]]:
    """(node, group) -> (term, leader) as each node says."""
    out = {}
    for node in cluster.running():
        for g in cluster.wait_status(node).groups:
            out[(node, g.group)] = (g.term, g.leader)
    return out


@dataclass(frozen=True)
class Stalls:
    buckets: dict[float, float]      # le -> observations at most that late
    count: float

    @classmethod
    def read(cls, cluster: NodeCluster, node: int, histogram: str = "epochlog_loop_stall_seconds") -> Stalls:
        metrics = cluster.wait_metrics(node)
        buckets = {float(dict(labels)["le"]): value for (name, labels), value in metrics.items()
                   if name == f"{histogram}_bucket"}
        count = metrics.get((f"{histogram}_count", ()))
        assert buckets and count is not None, f"no {histogram} on the node"
        return cls(buckets, count)

    def since(self, before: Stalls) -> tuple[float, float]:
        """(measurements since `before`, the smallest bucket bound holding every one of them)."""
        n = self.count - before.count
        bound = min(le for le, v in self.buckets.items() if v - before.buckets[le] >= n)
        return n, bound

    def histogram(self, before: Stalls) -> str:
        """The measurements since `before` by bucket, for the report: 'le 0.005: 380, le 0.01: 2, ...'."""
        out, below = [], 0.0
        for le in sorted(self.buckets):
            n = self.buckets[le] - before.buckets[le] - below
            below += n
            if n:
                out.append(f"le {le}: {n:.0f}")
        return ", ".join(out)


class RssSampler:
    """The largest VmRSS of a process, sampled every 0.1 s from /proc, until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start_kib = self.read()
        self.max_kib = self.start_kib
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def read(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.max_kib = max(self.max_kib, self.read())

    def stop(self) -> float:
        """Growth at the peak, in MiB."""
        self._stop.set()
        self._thread.join()
        return (self.max_kib - self.start_kib) / 1024


# --- the requests ----------------------------------------------------------------------------------

@dataclass
class Outcome:
    """What the attack saw, counted by kind (thread-safe enough: one lock)."""

    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, n: int = 1) -> None:
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + n

    def note(self, text: str) -> None:
        with self.lock:
            if len(self.notes) < 20:
                self.notes.append(text)


Attack = Callable[[NodeCluster, threading.Event, Outcome], None]


def _closed_or_answered(sock: socket.socket, timeout: float) -> str:
    """'closed' when the server closes the connection, 'answered' when a response arrives first."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(4)
    except ConnectionResetError:
        return "closed"
    except TimeoutError:
        return "no answer"
    return "answered" if data else "closed"


def _kafka_connect(cluster: NodeCluster) -> socket.socket:
    host, port = cluster.nodes[ATTACKED].kafka_address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


@functools.cache
def _metadata_of_200000_topics_frame() -> bytes:
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=f"no-such-topic-{i:06d}")
                                      for i in range(200_000)], allow_auto_topic_creation=False)
    request.API_VERSION = 4
    request.with_header(correlation_id=1, client_id="loop-bounds")
    return bytes(request.encode(header=True, framed=True))


def metadata_of_200000_topics(cluster: NodeCluster, stop: threading.Event, out: Outcome) -> None:
    frame = _metadata_of_200000_topics_frame()
    while not stop.is_set():
        with _kafka_connect(cluster) as sock:
            sock.sendall(frame)
            out.add(_closed_or_answered(sock, 60))


@functools.cache
def _gzip_bomb_batch() -> bytes:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)        # gzip framing
    body = b"".join(deflate.compress(bytes(MIB)) for _ in range(200)) + deflate.flush()   # 200 MiB of zeros
    batch = bytearray(HEADER.pack(0, HEADER_SIZE - LOG_OVERHEAD + len(body), 0, MAGIC, 0, 1, 0, 0, 0, -1, -1, -1, 1))
    batch += body
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))
    return bytes(batch)


def gzip_bomb(cluster: NodeCluster, stop: threading.Event, out: Outcome) -> None:
    batch = _gzip_bomb_batch()
    out.note(f"batch of {len(batch)} bytes")
    with RawKafka(cluster.nodes[ATTACKED].kafka_address, timeout=60) as raw:
        while not stop.is_set():
            response = raw.call(ProduceRequest(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
                ProduceRequest.TopicProduceData(name="__kv", partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=bytes(batch))])]),
                ProduceResponse, 7)
            result = response.responses[0].partition_responses[0]
            out.add(f"error {result.error_code}")
            if result.error_code != 10:
                out.note(str(result.error_message))


def pipelined_gets(cluster: NodeCluster, stop: threading.Event, out: Outcome) -> None:
    """One frame of 100,000 gets, then (next round) one frame of 10 get_many calls of 10,000 keys each."""
    n = 100_000
    get = {"type": "get", "key": "kv/loop/x"}
    pipelined = frame_bytes({"type": "requests", "requests": [[i, get, 120_000] for i in range(1, n + 1)]})
    many = frame_bytes({"type": "requests", "requests": [[i, {"type": "gets", "gets": [get] * 10_000}, 120_000]
                                                         for i in range(1, 11)]})
    conn = RawConnection(cluster.endpoint(ATTACKED), timeout=120)
    try:
        conn.hello()
        while not stop.is_set():
            conn.send_bytes(pipelined)
            replies = conn.replies(set(range(1, n + 1)), timeout=300)
            out.add("frames answered")
            out.add("ok replies", sum(1 for r in replies.values() if r[2] is None and r[1]["type"] == "got"))
            out.add("error replies", sum(1 for r in replies.values() if r[2] is not None))
            conn.send_bytes(many)                   # each round sends both forms, however short the attack
            replies = conn.replies(set(range(1, 11)), timeout=300)
            out.add("frames answered")
            out.add("ok replies", sum(len(r[1]["replies"]) for r in replies.values()
                                      if r[2] is None and r[1]["type"] == "got_many"))
            out.add("error replies", sum(1 for r in replies.values() if r[2] is not None))
    finally:
        conn.close()


def join_groups(cluster: NodeCluster, stop: threading.Event, out: Outcome) -> None:
    round_ = 0
    with RawKafka(cluster.nodes[ATTACKED].kafka_address, timeout=60) as raw:
        while not stop.is_set():
            round_ += 1
            for start in range(0, 5_000, 50):            # pipelined, 50 at a time
                ids = []
                for i in range(start, start + 50):
                    ids.append(raw.send(JoinGroupRequest(
                        group_id=f"loop-{round_}-{i}", session_timeout_ms=1_800_000, rebalance_timeout_ms=60_000,
                        member_id="", protocol_type="consumer",
                        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")]), 3))
                for cid in ids:
                    out.add(f"error {raw.receive(JoinGroupResponse, 3, cid).error_code}")
                if stop.is_set():
                    return


def idle_connections(cluster: NodeCluster, stop: threading.Event, out: Outcome) -> None:
    held: list[RawConnection] = []
    try:
        while not stop.is_set():
            for _ in range(2 * MAX_CONNECTIONS - len(held)):
                conn = RawConnection(cluster.endpoint(ATTACKED), timeout=30)
                conn.send({"type": "client_hello", "version": 1, "client": "idle"})
                first = conn.frame()
                if isinstance(first, dict) and first.get("type") == "server_hello":
                    held.append(conn)
                    continue
                conn.close()
                if isinstance(first, dict) and first.get("type") == "replies":
                    (reply,) = first["replies"]
                    out.add(f"refused {reply[2][0]} retriable={reply[2][2]}")
                else:
                    out.add(f"refused {first!r}")
            out.add("greeted", len(held) - out.counts.get("greeted", 0))
            stop.wait(1.0)
    finally:
        for conn in held:
            conn.close()


def partial_kafka_frames(cluster: NodeCluster, stop: threading.Event, out: Outcome) -> None:
    declared, sent = 90 * MIB, 85 * MIB
    chunk = bytes(MIB)

    def one() -> None:
        while not stop.is_set():
            with _kafka_connect(cluster) as sock:
                try:
                    sock.sendall(struct.pack(">i", declared))
                    for _ in range(sent // MIB):
                        sock.sendall(chunk)
                    out.add("sent in full")
                except OSError:
                    out.add("closed while sending")
                    continue
                out.add(_closed_or_answered(sock, KAFKA_FRAME_TIMEOUT_MS / 1000 + 30))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@dataclass(frozen=True)
class Case:
    attack: Attack
    threads: int
    rss_limit_mib: float
    check: Callable[[Outcome], None]
    # Builds what the attack sends before its window opens: at load 17 encoding the 200,000-topic
    # request took the whole window, and no request was sent at all (the gzip bomb's 200 MiB likewise).
    prepare: Callable[[], object] = lambda: None


def _check_metadata(out: Outcome) -> None:
    assert out.counts.get("closed", 0) >= 2 and set(out.counts) == {"closed"}, out.counts


def _check_gzip(out: Outcome) -> None:
    assert out.counts.get("error 10", 0) >= 4 and set(out.counts) == {"error 10"}, (out.counts, out.notes)


def _check_gets(out: Outcome) -> None:
    frames = out.counts.get("frames answered", 0)
    assert frames >= 2 and out.counts.get("ok replies") == frames * 100_000, out.counts


def _check_joins(out: Outcome) -> None:
    assert 0 < out.counts.get("error 0", 0) <= MAX_GROUPS, out.counts
    assert out.counts.get("error 81", 0) >= 1_000, out.counts       # GROUP_MAX_SIZE_REACHED
    assert set(out.counts) == {"error 0", "error 81"}, out.counts


def _check_idle(out: Outcome) -> None:
    assert 0 < out.counts.get("greeted", 0) <= MAX_CONNECTIONS, out.counts
    assert out.counts.get("refused connection_limit retriable=True", 0) >= MAX_CONNECTIONS, out.counts
    assert set(out.counts) == {"greeted", "refused connection_limit retriable=True"}, out.counts


def _check_partial(out: Outcome) -> None:
    # A connection either is closed while sending (past the budget) or after frame_timeout_ms.
    assert out.counts.get("closed while sending", 0) + out.counts.get("closed", 0) >= 3, out.counts
    assert not out.counts.get("answered") and not out.counts.get("no answer"), out.counts


CASES = {
    "metadata-200000-topics": Case(metadata_of_200000_topics, 2, 100, _check_metadata,
                                   prepare=_metadata_of_200000_topics_frame),
    "gzip-bomb": Case(gzip_bomb, 2, 100, _check_gzip, prepare=_gzip_bomb_batch),
    "100000-pipelined-gets": Case(pipelined_gets, 1, 200, _check_gets),
    "5000-join-groups": Case(join_groups, 1, 100, _check_joins),
    "idle-connections": Case(idle_connections, 1, 100, _check_idle),
    "partial-kafka-frames": Case(partial_kafka_frames, 1, KAFKA_BUDGET / MIB + 60, _check_partial),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_request_repeated_for_5_s_moves_no_leader_and_stalls_no_heartbeat(
        cluster: NodeCluster, name: str) -> None:
    case = CASES[name]
    case.prepare()
    for group in cluster.groups:
        assert cluster.leader(group) == ATTACKED, f"node {ATTACKED} no longer leads {group}"
    terms = _terms(cluster)
    stalls = Stalls.read(cluster, ATTACKED)
    own_stalls = Stalls.read(cluster, ATTACKED, OWN)
    pid = cluster.nodes[ATTACKED].pid
    assert pid is not None
    rss = RssSampler(pid)
    stop, out = threading.Event(), Outcome()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            case.attack(cluster, stop, out)
        except BaseException as exc:   # reported by the test, not lost in the thread
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, daemon=True) for _ in range(case.threads)]
    started = time.monotonic()
    for t in threads:
        t.start()
    stop.wait(ATTACK_S)
    stop.set()
    for t in threads:
        t.join(360)
        assert not t.is_alive(), f"the attack did not end within 6 min of its {ATTACK_S:.0f} s (outcome: {out.counts})"
    elapsed = time.monotonic() - started
    growth = rss.stop()
    after = Stalls.read(cluster, ATTACKED)
    own_after = Stalls.read(cluster, ATTACKED, OWN)
    measured, longest = after.since(stalls)
    _, longest_own = own_after.since(own_stalls)
    print(f"{name}: {elapsed:.1f} s, outcome {out.counts} {out.notes}, RSS +{growth:.0f} MiB, {measured:.0f} "
          f"loop measurements, every stall <= {longest} s ({after.histogram(stalls)}), its own part <= "
          f"{longest_own} s ({own_after.histogram(own_stalls)})")
    assert not errors, f"the attack failed: {errors[0]!r} (outcome: {out.counts})"

    assert _terms(cluster) == terms, "a leader or a term changed during the attack"
    assert longest_own <= STALL_LIMIT_S, f"the node held its loop up to {longest_own} s (limit {STALL_LIMIT_S} s)"
    assert longest <= WAIT_LIMIT_S, f"the loop ran timers up to {longest} s late (limit {WAIT_LIMIT_S} s)"
    # The measurements cover the attack: one a tick, each at most `longest` late, so at least one per
    # tick + longest (a loop that stopped running its timers would have few, not a long stall only).
    # Not one per tick: on a loaded machine the process is not scheduled for every tick (load 24: 9 a s).
    assert measured >= 0.9 * elapsed / (TICK_MS / 1000 + longest), (measured, elapsed, longest)
    assert growth < case.rss_limit_mib, f"RSS grew by {growth:.0f} MiB (limit {case.rss_limit_mib:.0f})"
    case.check(out)
    with Client([cluster.endpoint(ATTACKED)], timeout=20) as client:   # and it serves as before
        assert client.put("loop/after", name.encode()).ok

