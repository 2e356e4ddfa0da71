"""The frame-aware proxy of tests/support/proxy.py, checked against a plain TCP collector: frames arrive
whole, a dropping direction loses whole frames but lets each connection's first frame (the transport's
Hello) through, the other direction is unaffected (one-way), a delay holds frames back in order, and a
severed link aborts its connection and refuses new ones until healed.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.proxy import ProxyNetwork

pytestmark = pytest.mark.timeout(60)


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


async def _read_frames(reader: asyncio.StreamReader, n: int, timeout: float = 2.0) -> list[bytes]:
    out = []
    for _ in range(n):
        header = await asyncio.wait_for(reader.readexactly(4), timeout)
        out.append(await asyncio.wait_for(reader.readexactly(int.from_bytes(header, "big")), timeout))
    return out


async def _quiet(reader: asyncio.StreamReader, seconds: float) -> bool:
    """True if nothing arrives on `reader` for `seconds`."""
    try:
        await asyncio.wait_for(reader.read(1), seconds)
    except TimeoutError:
        return True
    return False  # data arrived, or the connection closed


async def _closed(reader: asyncio.StreamReader) -> bool:
    """True once the peer closed or reset the connection (within 2 s)."""
    try:
        return await asyncio.wait_for(reader.read(), 2.0) == b""
    except ConnectionError:
        return True


def test_proxy_drops_delays_and_severs_whole_frames() -> None:
    async def main() -> None:
        accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()

        async def on_accept(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await accepted.put((r, w))
        server = await asyncio.start_server(on_accept, "127.0.0.1", 0)
        target = server.sockets[0].getsockname()[:2]
        net = ProxyNetwork()
        try:
            port = net.add_link(1, 2, target)
            dial_r, dial_w = await asyncio.open_connection("127.0.0.1", port)
            acc_r, acc_w = await asyncio.wait_for(accepted.get(), 2.0)

            # Frames pass whole, in order, both ways; big ones too (split across reads).
            big = bytes(range(256)) * 1024
            dial_w.write(_frame(b"hello-1") + _frame(big) + _frame(b"x"))
            assert await _read_frames(acc_r, 3) == [b"hello-1", big, b"x"]
            acc_w.write(_frame(b"hello-2") + _frame(b"y"))
            assert await _read_frames(dial_r, 2) == [b"hello-2", b"y"]

            # One way: 1 -> 2 drops whole frames; 2 -> 1 still passes.
            net.drop(1, 2)
            dial_w.write(_frame(b"lost-1") + _frame(b"lost-2"))
            acc_w.write(_frame(b"still"))
            assert await _read_frames(dial_r, 1) == [b"still"]
            assert await _quiet(acc_r, 0.2)
            net.heal()
            dial_w.write(_frame(b"after-heal"))
            assert await _read_frames(acc_r, 1) == [b"after-heal"]
            assert net.direction(1, 2).dropped == 2

            # A delay holds frames back, in order.
            net.delay(1, 2, 0.15)
            t0 = time.monotonic()
            dial_w.write(_frame(b"d1"))
            dial_w.write(_frame(b"d2"))
            assert await _read_frames(acc_r, 2) == [b"d1", b"d2"]
            assert time.monotonic() - t0 >= 0.14
            net.heal()

            # A new connection's first frame passes even while its direction drops (the Hello).
            net.drop(1, 2)
            _dial2_r, dial2_w = await asyncio.open_connection("127.0.0.1", port)
            acc2_r, acc2_w = await asyncio.wait_for(accepted.get(), 2.0)
            dial2_w.write(_frame(b"hello-again") + _frame(b"dropped"))
            assert await _read_frames(acc2_r, 1) == [b"hello-again"]
            assert await _quiet(acc2_r, 0.2)
            net.heal()

            # Sever: connections aborted, new ones refused until heal.
            net.sever(1, 2)
            assert await _closed(acc_r) and await _closed(dial_r)
            refused_r, _ = await asyncio.open_connection("127.0.0.1", port)
            assert await _closed(refused_r)
            assert net.link(1, 2).refused >= 1
            net.heal()
            _dial3_r, dial3_w = await asyncio.open_connection("127.0.0.1", port)
            acc3_r, _ = await asyncio.wait_for(accepted.get(), 2.0)
            dial3_w.write(_frame(b"back"))
            assert await _read_frames(acc3_r, 1) == [b"back"]
            for w in (dial_w, acc_w, dial2_w, acc2_w, dial3_w):
                w.transport.abort()
        finally:
            net.close()
            server.close()
    asyncio.run(main())
