"""The peer transport over real sockets: mutual TLS and identity, and the limits of the peer port.

Every test runs on asyncio's loop and on uvloop (`epochlog serve` uses uvloop).
Peers are `PeerTransport`s of this process listening on 127.0.0.1 port 0; outsiders are raw asyncio
connections (with or without a certificate) sending hand-built frames. "Nothing reaches the core"
is checked on `deliver`, the transport's only way to the groups.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import uvloop

from epochlog.certs import ClusterCA
from epochlog.client import Client
from eventlog.config import LogConfig
from eventlog.errors import ConfigError
from eventlog.raft.config import RaftConfig
from eventlog.raft.runtime.config import PeerLimitsConfig, PeerTlsConfig
from eventlog.raft.runtime.tls import load_peer_tls
from eventlog.raft.runtime.transport import (
    FRAME_SPLIT_BYTES,
    HELLO_MAX_BYTES,
    Batch,
    FrameReader,
    Hello,
    PeerTransport,
    encode_batches,
    encode_frame,
    largest_frame_bytes,
)
from eventlog.raft.types import Append, Entry, Heartbeat, Vote
from tests.support.nodes import NodeCluster
from tests.support.wait import eventually

CLUSTER = "transport-test"
LOOPS = ["asyncio", "uvloop"]
WAIT_S = 10.0


def run(loop_kind: str, main: Callable[[], Awaitable[None]]) -> None:
    factory = uvloop.new_event_loop if loop_kind == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


@dataclass
class Pki:
    """A cluster CA, member files for nodes 1, 2, 3 and 9 (`<root>/n<id>/tls`), a client certificate and
    a second CA of the same cluster name with its own node 1."""

    root: Path
    ca: ClusterCA
    foreign: ClusterCA

    def node_dir(self, node: int) -> Path:
        return self.root / f"n{node}"

    def member(self, node: int) -> tuple[Path, Path]:
        return self.node_dir(node) / "tls" / "node.crt", self.node_dir(node) / "tls" / "node.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = ClusterCA.create(root / "ca", CLUSTER)
    for node in (1, 2, 3, 9):
        ca.issue_member(node, root / f"n{node}" / "tls")
    ca.issue_client("alice", root / "clients")
    foreign = ClusterCA.create(root / "foreign-ca", CLUSTER)
    foreign.issue_member(1, root / "foreign-n1" / "tls")
    return Pki(root, ca, foreign)


@dataclass
class Peer:
    """One PeerTransport and what it delivered."""

    transport: PeerTransport
    delivered: list[tuple[int, str, Any]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.transport.port


async def start_peer(pki: Pki, node: int, *, insecure: bool = False, limits: PeerLimitsConfig | None = None,
                     tls_dir: Path | None = None, features: dict[str, int] | None = None) -> Peer:
    tls = load_peer_tls(PeerTlsConfig(insecure=insecure), tls_dir or pki.node_dir(node), CLUSTER, node)
    delivered: list[tuple[int, str, Any]] = []
    transport = PeerTransport(node, CLUSTER, {}, ("127.0.0.1", 0),
                              lambda src, group, msg: delivered.append((src, group, msg)), tls=tls, limits=limits,
                              features=features)
    await transport.start()
    return Peer(transport, delivered)



def client_context(cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    """An outsider's TLS client: verifies nothing, presents `cert` if given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if cert is not None:
        ctx.load_cert_chain(*map(str, cert))
    return ctx


async def raw(port: int, *, tls: bool = True,
              cert: tuple[Path, Path] | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    ctx = client_context(cert) if tls else None
    return await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="" if ctx else None)


async def closed_by_peer(reader: asyncio.StreamReader, timeout: float = WAIT_S) -> bytes:
    """Read until the other side closes (EOF, a reset or a TLS alert); what was read. AssertionError if
    it stays open past `timeout`."""
    got = bytearray()
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        left = deadline - asyncio.get_running_loop().time()
        assert left > 0, f"the connection is still open after {timeout} s (read {len(got)} bytes)"
        try:
            chunk = await asyncio.wait_for(reader.read(65536), left)
        except (ConnectionError, ssl.SSLError, OSError):
            return bytes(got)
        except TimeoutError:
            continue
        if not chunk:
            return bytes(got)
        got += chunk


def vote(src: int, dst: int, term: int = 10**12) -> Vote:
    return Vote(term=term, src=src, dst=dst, last_index=0, last_term=0)


def forged(src: int, dst: int) -> bytes:
    """A hello claiming node `src` and the issue's vote with term 10^12."""
    return encode_frame(Hello(CLUSTER, src)) + encode_frame(Batch([("kv", vote(src, dst))]))


# --- members ------------------------------------------------------------------------------------

@pytest.mark.parametrize("loop", LOOPS)
def test_members_talk_over_mutual_tls_13_and_deliver_names_the_certificate_node(pki: Pki, loop: str) -> None:
    async def main() -> None:
        one, two = await start_peer(pki, 1), await start_peer(pki, 2)
        try:
            one.transport.add_peer(2, ("127.0.0.1", two.port))   # the lower id dials
            await eventually(lambda: one.transport.connected(2) and two.transport.connected(1), WAIT_S, "the connection")
            conn = two.transport._conns[1]
            assert conn.transport is not None
            assert conn.transport.get_extra_info("ssl_object").version() == "TLSv1.3"
            assert conn.certified == 1
            one.transport.send(2, "kv", Heartbeat(term=3, src=1, dst=2, commit=0))
            two.transport.send(1, "kv", Heartbeat(term=3, src=2, dst=1, commit=0))
            await eventually(lambda: bool(two.delivered and one.delivered), WAIT_S, "both messages")
            assert two.delivered == [(1, "kv", Heartbeat(term=3, src=1, dst=2, commit=0))]
            assert one.delivered == [(2, "kv", Heartbeat(term=3, src=2, dst=1, commit=0))]
            assert not one.transport.closes.counts and not two.transport.closes.counts
        finally:
            await one.transport.close()
            await two.transport.close()
    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_big_flush_is_cut_into_frames_and_arrives_in_order(pki: Pki, loop: str) -> None:
    async def main() -> None:
        one, two = await start_peer(pki, 1), await start_peer(pki, 2)
        try:
            one.transport.add_peer(2, ("127.0.0.1", two.port))
            await eventually(lambda: one.transport.connected(2) and two.transport.connected(1), WAIT_S, "the connection")
            sent = [Heartbeat(term=i, src=1, dst=2, commit=i) for i in range(300_000)]   # ~14 MiB in one turn: 4 frames
            for msg in sent:
                one.transport.send(2, "kv", msg)
            await eventually(lambda: len(two.delivered) == len(sent), 60, "every message")
            assert [m for _, _, m in two.delivered] == sent
        finally:
            await one.transport.close()
            await two.transport.close()
    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_flush_writes_what_is_queued_at_once_and_the_turn_writes_the_rest_in_order(pki: Pki, loop: str) -> None:
    async def main() -> None:
        one, two = await start_peer(pki, 1), await start_peer(pki, 2)
        try:
            one.transport.add_peer(2, ("127.0.0.1", two.port))
            await eventually(lambda: one.transport.connected(2) and two.transport.connected(1), WAIT_S, "the connection")
            conn = one.transport._conns[2]
            frames: list[bytes] = []
            real_write = conn.write

            def write(data: bytes) -> None:
                frames.append(data)
                real_write(data)

            conn.write = write  # type: ignore[method-assign]
            sent = [Heartbeat(term=i, src=1, dst=2, commit=i) for i in (1, 2, 3)]
            one.transport.send(2, "kv", sent[0])
            one.transport.flush()
            assert len(frames) == 1, "written by flush(), before the loop's turn ends"
            one.transport.flush()
            assert len(frames) == 1, "nothing queued: nothing written"
            one.transport.send(2, "kv", sent[1])
            one.transport.send(2, "kv", sent[2])
            assert len(frames) == 1
            await eventually(lambda: len(two.delivered) == 3, WAIT_S, "every message")
            assert [m for _, _, m in two.delivered] == sent
            assert len(frames) == 2, "what was queued after the flush left in one write at the end of the turn"
        finally:
            await one.transport.close()
            await two.transport.close()
    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_the_dialer_refuses_a_listener_whose_certificate_names_another_node(pki: Pki, loop: str) -> None:
    """Node 1 believes node 2 listens at an address where node 3 does: node 3's certificate is refused."""
    async def main() -> None:
        one, three = await start_peer(pki, 1), await start_peer(pki, 3)
        try:
            one.transport.add_peer(2, ("127.0.0.1", three.port))
            await eventually(lambda: one.transport.closes.counts.get("identity", 0) >= 1, WAIT_S, "the refusal")
            assert not one.transport.connected(2) and not three.transport.connected(1)
            one.transport.send(2, "kv", vote(1, 2))
            await asyncio.sleep(0.2)
            assert three.delivered == []
        finally:
            await one.transport.close()
            await three.transport.close()
    run(loop, main)


# --- outsiders ----------------------------------------------------------------------------------

@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_without_a_certificate_fails_the_handshake_and_reaches_nothing(pki: Pki, loop: str) -> None:
    async def main() -> None:
        two = await start_peer(pki, 2)
        try:
            reader, writer = await raw(two.port)   # TLS 1.3: the server refuses after the client's Finished
            writer.write(forged(1, 2))
            got = await closed_by_peer(reader)
            assert got == b"", "the node sent its hello to a peer without a certificate"
            writer.close()
            reader, writer = await raw(two.port, tls=False)   # plaintext to a TLS port
            writer.write(forged(1, 2))
            assert await closed_by_peer(reader) == b""
            writer.close()
            await eventually(lambda: two.transport.closes.counts.get("tls_handshake", 0) == 2, WAIT_S, "two failed handshakes")
            assert two.delivered == [] and two.transport.unauthenticated == 0
        finally:
            await two.transport.close()
    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_certificates_of_another_ca_and_client_certificates_are_refused(pki: Pki, loop: str) -> None:
    async def main() -> None:
        two = await start_peer(pki, 2)
        try:
            foreign = (pki.root / "foreign-n1" / "tls" / "node.crt", pki.root / "foreign-n1" / "tls" / "node.key")
            reader, writer = await raw(two.port, cert=foreign)   # node 1 of the right cluster, wrong CA
            writer.write(forged(1, 2))
            assert await closed_by_peer(reader) == b""
            writer.close()
            alice = (pki.root / "clients" / "alice.crt", pki.root / "clients" / "alice.key")
            reader, writer = await raw(two.port, cert=alice)   # the CA's, but a client
            writer.write(forged(1, 2))
            assert await closed_by_peer(reader) == b""
            writer.close()
            await eventually(lambda: two.transport.closes.counts.get("identity", 0) == 1, WAIT_S, "the client's refusal")
            assert two.transport.closes.counts["tls_handshake"] == 1
            assert two.delivered == []
        finally:
            await two.transport.close()
    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_member_certificate_claiming_another_node_id_in_its_hello_is_refused(pki: Pki, loop: str) -> None:
    """Node 9's valid certificate, a hello claiming node 1 (the leader's id, say): refused; node 9 itself
    is accepted and delivers as node 9 whatever `src` its messages carry."""
    async def main() -> None:
        two = await start_peer(pki, 2)
        try:
            reader, writer = await raw(two.port, cert=pki.member(9))
            writer.write(forged(1, 2))
            got = await closed_by_peer(reader)
            assert FrameReader().frames(got) == [Hello(CLUSTER, 2, read_index=True)]   # its hello, then the close
            writer.close()
            assert two.transport.closes.counts["identity"] == 1 and two.delivered == []
            reader, writer = await raw(two.port, cert=pki.member(9))
            writer.write(forged(9, 2))   # honest hello; the vote inside still says src=9
            await eventually(lambda: bool(two.delivered), WAIT_S, "node 9's message")
            assert two.delivered == [(9, "kv", vote(9, 2))]
            writer.write(encode_frame(Batch([("kv", vote(1, 2))])))   # a message claiming src 1
            await eventually(lambda: len(two.delivered) == 2, WAIT_S, "the second message")
            assert two.delivered[1][0] == 9, "deliver must name the certificate's node, not the message's src"
            writer.close()
        finally:
            await two.transport.close()
    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_insecure_believes_the_hello_but_refuses_another_cluster_or_its_own_id(pki: Pki, loop: str) -> None:
    async def main() -> None:
        two = await start_peer(pki, 2, insecure=True)
        try:
            reader, writer = await raw(two.port, tls=False)
            writer.write(encode_frame(Hello("other", 1)) + encode_frame(Batch([("kv", vote(1, 2))])))
            await closed_by_peer(reader)
            reader, writer = await raw(two.port, tls=False)
            writer.write(encode_frame(Hello(CLUSTER, 2)) + encode_frame(Batch([("kv", vote(2, 2))])))
            await closed_by_peer(reader)
            assert two.transport.closes.counts["identity"] == 2 and two.delivered == []
            reader, writer = await raw(two.port, tls=False)
            writer.write(forged(1, 2))
            await eventually(lambda: bool(two.delivered), WAIT_S, "the plaintext peer's message")
            assert two.delivered == [(1, "kv", vote(1, 2))]
            writer.close()
        finally:
            await two.transport.close()
    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_peer_takes_read_index_messages_only_when_its_hello_says_so(pki: Pki, loop: str) -> None:
    """A member's hello says it takes a follower's ReadIndex; an older version's hello has no such field
    (it would close the connection on one), so `reads_index` is false for it, and true for a peer that is
    not connected (a message to it is dropped like any other)."""
    async def main() -> None:
        two = await start_peer(pki, 2, insecure=True)
        try:
            assert two.transport.reads_index(1)
            for hello, takes in ((Hello(CLUSTER, 1), False), (Hello(CLUSTER, 1, read_index=True), True)):
                reader, writer = await raw(two.port, tls=False)
                writer.write(encode_frame(hello) + encode_frame(Batch([("kv", vote(1, 2))])))
                await eventually(lambda: two.transport.connected(1), WAIT_S, "the peer's hello")
                assert two.transport.reads_index(1) is takes
                writer.close()
                await eventually(lambda: not two.transport.connected(1), WAIT_S, "the peer's close")
            assert two.transport.reads_index(1)
        finally:
            await two.transport.close()
    run(loop, main)


# --- limits -------------------------------------------------------------------------------------

@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("insecure", [False, True])
def test_a_frame_bigger_than_a_hello_before_the_hello_is_closed_at_its_header(pki: Pki, loop: str,
                                                                              insecure: bool) -> None:
    """The issue's hello-less connection declaring a 256 MiB frame: closed on its 4-byte header."""
    async def main() -> None:
        two = await start_peer(pki, 2, insecure=insecure)
        try:
            reader, writer = await raw(two.port, tls=not insecure, cert=None if insecure else pki.member(9))
            writer.write(struct.pack(">I", 256 << 20) + b"\0" * 65536)
            await closed_by_peer(reader)
            assert two.transport.closes.counts["bad_frame"] == 1
            assert two.transport.partial_bytes == 0 and two.transport.unauthenticated == 0
        finally:
            await two.transport.close()
    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("insecure", [False, True])
def test_silent_connections_are_closed_after_the_hello_timeout(pki: Pki, loop: str, insecure: bool) -> None:
    async def main() -> None:
        two = await start_peer(pki, 2, insecure=insecure, limits=PeerLimitsConfig(hello_timeout_ms=500))
        try:
            # One silent before TLS (a bare TCP connection to a TLS port), one after TLS without a hello.
            bare = await raw(two.port, tls=False)
            started = asyncio.get_running_loop().time()
            hello_less = await raw(two.port, tls=not insecure, cert=None if insecure else pki.member(9))
            for reader, _ in (bare, hello_less):
                await closed_by_peer(reader, timeout=5.0)
            elapsed = asyncio.get_running_loop().time() - started
            assert 0.4 <= elapsed < 5.0, elapsed
            assert two.transport.closes.counts["hello_timeout"] == 2
            assert two.transport.unauthenticated == 0
        finally:
            await two.transport.close()
    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_truncated_frame_is_closed_after_the_frame_timeout(pki: Pki, loop: str) -> None:
    async def main() -> None:
        two = await start_peer(pki, 2, limits=PeerLimitsConfig(frame_timeout_ms=500))
        try:
            reader, writer = await raw(two.port, cert=pki.member(9))
            frame = encode_frame(Batch([("kv", vote(9, 2))]))
            writer.write(encode_frame(Hello(CLUSTER, 9)) + frame[:-3])   # all but the last 3 bytes
            await eventually(lambda: two.transport.connected(9), WAIT_S, "node 9's hello")
            began = asyncio.get_running_loop().time()
            await closed_by_peer(reader, timeout=5.0)
            assert asyncio.get_running_loop().time() - began >= 0.4
            assert two.transport.closes.counts["frame_timeout"] == 1
            assert two.delivered == [] and two.transport.partial_bytes == 0
        finally:
            await two.transport.close()
    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_partial_frames_over_every_connection_stay_within_the_budget(pki: Pki, loop: str) -> None:
    """Two members each start a 3 MiB frame under a 4 MiB budget: the one that would pass it is closed
    and its bytes given back; the other completes its frame."""
    async def main() -> None:
        limits = PeerLimitsConfig(partial_frames_bytes=4 << 20)
        two = await start_peer(pki, 2, limits=limits)
        try:
            frame = encode_frame(Batch([("kv", Heartbeat(term=i, src=9, dst=2, commit=i)) for i in range(60_000)]))
            assert 3 << 20 > len(frame) > 2 << 20
            _r9, w9 = await raw(two.port, cert=pki.member(9))
            r3, w3 = await raw(two.port, cert=pki.member(3))
            w9.write(encode_frame(Hello(CLUSTER, 9)) + frame[:-1])
            await eventually(lambda: two.transport.partial_bytes >= len(frame) - 1, WAIT_S, "node 9's partial frame")
            w3.write(encode_frame(Hello(CLUSTER, 3)) + frame[:-1])
            await closed_by_peer(r3)
            assert two.transport.closes.counts["partial_frames"] == 1
            assert two.transport.partial_bytes == len(frame) - 1
            w9.write(frame[-1:])
            await eventually(lambda: len(two.delivered) == 60_000, WAIT_S, "node 9's frame")
            assert two.transport.partial_bytes == 0
            w9.close()
        finally:
            await two.transport.close()
    run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_connections_beyond_the_unauthenticated_cap_are_closed_at_once(pki: Pki, loop: str) -> None:
    async def main() -> None:
        two = await start_peer(pki, 2, limits=PeerLimitsConfig(unauthenticated_connections=3,
                                                               hello_timeout_ms=60_000))
        try:
            pending = [await asyncio.open_connection("127.0.0.1", two.port) for _ in range(3)]
            await eventually(lambda: two.transport.unauthenticated == 3, WAIT_S, "three pending handshakes")
            extra_r, _extra_w = await asyncio.open_connection("127.0.0.1", two.port)
            await closed_by_peer(extra_r, timeout=5.0)
            assert two.transport.closes.counts["unauthenticated_connections"] == 1
            for _, w in pending:   # their end frees the slots: a member gets in again
                w.close()
            await eventually(lambda: two.transport.unauthenticated == 0, WAIT_S, "the slots back")
            _reader, writer = await raw(two.port, cert=pki.member(9))
            writer.write(forged(9, 2))
            await eventually(lambda: bool(two.delivered), WAIT_S, "node 9's message")
            writer.close()
        finally:
            await two.transport.close()
    run(loop, main)


def test_refusals_are_logged_at_a_bounded_rate(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        two = await start_peer(pki, 2)
        try:
            for _ in range(20):
                reader, writer = await raw(two.port, tls=False)
                writer.write(b"GET / HTTP/1.0\r\n\r\n")
                await closed_by_peer(reader)
                writer.close()
            await eventually(lambda: two.transport.closes.counts.get("tls_handshake") == 20, WAIT_S, "20 refusals")
        finally:
            await two.transport.close()
    with caplog.at_level(logging.WARNING, logger="eventlog.raft.runtime.transport"):
        run("uvloop", main)
    lines = [r for r in caplog.records if "tls_handshake" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


# --- frames and configuration -------------------------------------------------------------------

def test_frame_reader_takes_the_limit_in_force_for_each_frame() -> None:
    hello, batch = encode_frame(Hello(CLUSTER, 1)), encode_frame(Batch([("kv", vote(1, 2))]))
    reader = FrameReader(HELLO_MAX_BYTES)
    reader.feed(hello + batch + struct.pack(">I", HELLO_MAX_BYTES + 1))
    assert reader.next_frame() == Hello(CLUSTER, 1)
    reader.max_frame_bytes = 1 << 20   # the hello was accepted
    assert isinstance(reader.next_frame(), Batch)
    assert reader.next_frame() is None and reader.pending_bytes == 4
    reader.max_frame_bytes = HELLO_MAX_BYTES
    with pytest.raises(ValueError, match="exceeds the limit"):
        reader.next_frame()


def test_encode_batches_splits_at_the_target_and_keeps_order() -> None:
    msgs = [("kv", Heartbeat(term=i, src=1, dst=2, commit=i)) for i in range(20_000)]
    frames = encode_batches(msgs, split_bytes=64 << 10)
    assert len(frames) > 4 and all(len(f) <= 64 << 10 for f in frames)
    reader = FrameReader()
    got = [m for f in frames for frame in reader.frames(f) for m in frame.msgs]   # type: ignore[union-attr]
    assert got == msgs
    assert len(encode_batches(msgs)) == 1   # below FRAME_SPLIT_BYTES: one frame


def test_largest_frame_follows_raft_and_log_settings() -> None:
    assert largest_frame_bytes(RaftConfig(), LogConfig()) == FRAME_SPLIT_BYTES
    big = largest_frame_bytes(RaftConfig(snapshot_chunk_bytes=16 << 20), LogConfig())
    assert big > 16 << 20


def test_missing_or_wrong_tls_files_refuse_the_node_with_one_line(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cluster.tls.ca_file = .*file not found") as missing:
        load_peer_tls(PeerTlsConfig(), tmp_path / "empty", CLUSTER, 1)
    assert "\n" not in str(missing.value)
    with pytest.raises(ConfigError, match=r"cluster.tls.cert_file = .*names \['epochlog://transport-test/node/1'\], "
                                          r"not this node \(epochlog://transport-test/node/2\)"):
        load_peer_tls(PeerTlsConfig(), pki.node_dir(1), CLUSTER, 2)
    with pytest.raises(ConfigError, match=r"not this node \(epochlog://other/node/1\)"):
        load_peer_tls(PeerTlsConfig(), pki.node_dir(1), "other", 1)
    mixed = PeerTlsConfig(ca_file=str(pki.root / "foreign-ca" / "ca.crt"))
    with pytest.raises(ConfigError, match="is not issued by the CA"):
        load_peer_tls(mixed, pki.node_dir(1), CLUSTER, 1)
    wrong_key = PeerTlsConfig(key_file=str(pki.member(2)[1]))
    with pytest.raises(ConfigError, match="cluster.tls.key_file = .*cannot be used with"):
        load_peer_tls(wrong_key, pki.node_dir(1), CLUSTER, 1)
    assert load_peer_tls(PeerTlsConfig(insecure=True), tmp_path / "empty", CLUSTER, 1) is None


def test_an_expired_certificate_refuses_the_node_and_one_near_its_end_warns(
        pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pki.ca.issue_member(1, tmp_path / "expired" / "tls", days=0)   # valid until the moment it was made
    with pytest.raises(ConfigError, match=r"cluster.tls.cert_file = .* is valid from .* UTC, not now"):
        load_peer_tls(PeerTlsConfig(), tmp_path / "expired", CLUSTER, 1)
    pki.ca.issue_member(1, tmp_path / "soon" / "tls", days=10)
    with caplog.at_level(logging.WARNING, logger="eventlog.raft.runtime.tls"):
        assert load_peer_tls(PeerTlsConfig(), tmp_path / "soon", CLUSTER, 1) is not None
    assert any("expires on" in r.getMessage() for r in caplog.records)


# --- a whole cluster, in processes --------------------------------------------------------------

def test_a_plaintext_cluster_runs_only_when_asked_and_says_so(node_cluster_factory: Callable[..., NodeCluster]) -> None:
    """`insecure` is the explicit way to plaintext peers (through a plain proxy here): the nodes elect,
    commit and converge, and each logs its WARNING at start. (Every other runtime test runs TLS.)"""
    cluster = node_cluster_factory(insecure=True, proxied=True)
    cluster.start()
    leader = cluster.leader("kv", timeout=20)
    with Client([cluster.endpoint(leader)], timeout=10) as client:
        put = client.put("plaintext", b"plaintext")
    assert put.ok and put.offset >= 0, put
    cluster.wait_converged("kv", timeout=20)
    for i, node in cluster.nodes.items():
        assert "peer TLS is OFF" in node.stderr(), (i, node.stderr()[-2000:])
        assert not (node.data_dir / "tls").exists()
    assert cluster.stop_all() == {1: 0, 2: 0, 3: 0}


@pytest.mark.parametrize("loop", LOOPS)
def test_a_peers_features_are_what_its_hello_on_the_current_connection_says(pki: Pki, loop: str) -> None:
    """`features` in a hello (e.g. the views format level a node applies) is what `peer_features` gives
    while that connection lasts: {} for an older version's hello without the field, None once the peer is
    gone (not known now); and a transport's own hello carries its features."""
    async def main() -> None:
        two = await start_peer(pki, 2, insecure=True, features={"views_format": 2})
        try:
            assert two.transport.peer_features(1) is None
            for hello, features in ((Hello(CLUSTER, 1), {}), (Hello(CLUSTER, 1, features={"views_format": 7}),
                                                               {"views_format": 7})):
                reader, writer = await raw(two.port, tls=False)
                writer.write(encode_frame(hello) + encode_frame(Batch([("kv", vote(1, 2))])))
                await eventually(lambda: two.transport.connected(1), WAIT_S, "the peer's hello")
                assert two.transport.peer_features(1) == features
                got = await reader.readexactly(4)
                got += await reader.readexactly(int.from_bytes(got, "big"))
                assert FrameReader().frames(got) == [Hello(CLUSTER, 2, read_index=True,
                                                           features={"views_format": 2})]
                writer.close()
                await eventually(lambda: not two.transport.connected(1), WAIT_S, "the peer's close")
                assert two.transport.peer_features(1) is None
        finally:
            await two.transport.close()
    run(loop, main)


def test_a_frame_is_its_payloads_length_then_the_payload() -> None:
    """The wire format (a 4-byte big-endian length, then the msgpack payload), however large the frame:
    `encode_frame` writes the payload after a gap it fills with the length, and a reader takes it back."""
    encoder = msgspec.msgpack.Encoder()
    rng = random.Random(7)
    print("seed 7")
    for count in (0, 1, 3, 40):
        entries = tuple(Entry(index=10 + i, term=2, count=1, data=rng.randbytes(rng.choice([0, 9, 300, 70_000])))
                        for i in range(count))
        batch = Batch([("kv", Append(term=2, src=1, dst=3, prev_index=9, prev_term=2, entries=entries, commit=9)),
                       ("metadata", Heartbeat(term=1, src=1, dst=3, commit=4))])
        payload = encoder.encode(batch)
        frame = encode_frame(batch)
        assert bytes(frame) == len(payload).to_bytes(4, "big") + payload
        assert FrameReader().frames(bytes(frame)) == [batch]
