"""The master–worker channel (`pollux.litz.channel`) over real loopback sockets, without Ray.

The worker side runs `serve` on an asyncio server in a thread (as on a worker actor's event loop);
the master side is the blocking `ChannelClient`. The end-to-end runs (`test_litz_runtime.py`, the
recovery and elasticity tests) use the channel by default; these pin down its contract: the token
gates the connection, answers come in order (or as they finish, with overlap), large messages
arrive whole, and a worker that goes away is a `ChannelClosed`, not a hang.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator

import pytest

from pollux.litz.channel import ChannelClient, ChannelClosed, readable, serve

TOKEN = b"t" * 32


class _Server:
    """An asyncio server running `serve` with `handle`, on its own loop in a thread."""

    def __init__(self, handle: Callable[[bytes], Awaitable[bytes]], overlap: bool = False) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        self.writers: list[asyncio.StreamWriter] = []

        def connected(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> Awaitable[None]:
            self.writers.append(w)
            return serve(r, w, TOKEN, handle, overlap)

        async def start() -> asyncio.AbstractServer:
            return await asyncio.start_server(connected, "127.0.0.1", 0)

        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self.address = self.server.sockets[0].getsockname()[:2]

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            for w in self.writers:  # its connections too (Python 3.11's close() leaves them)
                w.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def echo() -> Iterator[_Server]:
    async def handle(msg: bytes) -> bytes:
        return b"re:" + msg

    srv = _Server(handle)
    yield srv
    srv.close()


def test_messages_are_answered_in_order_and_arrive_whole(echo: _Server) -> None:
    client = ChannelClient(echo.address, TOKEN)
    big = bytes(range(256)) * 40_000  # 10 MB: many recv calls on both sides
    msgs = [b"a", b"", big, b"b" * 70_000]
    for m in msgs:
        client.send(m)
    got = []
    while len(got) < len(msgs):
        assert readable([client], 10.0) == [client]
        got.append(client.receive())
    assert got == [b"re:" + m for m in msgs]
    assert readable([client], 0.05) == []  # nothing more was sent
    client.close()


def test_a_wrong_token_is_disconnected(echo: _Server) -> None:
    client = ChannelClient(echo.address, b"x" * 32)
    client.send(b"hello")
    assert readable([client], 10.0) == [client]  # EOF: the server closed the connection
    with pytest.raises(ChannelClosed, match="closed by the worker"):
        client.receive()
    client.close()


def test_overlap_answers_each_message_when_it_is_done() -> None:
    release = threading.Event()

    async def handle(msg: bytes) -> bytes:
        if msg == b"slow":
            while not release.is_set():
                await asyncio.sleep(0.005)
        return msg

    srv = _Server(handle, overlap=True)
    try:
        client = ChannelClient(srv.address, TOKEN)
        client.send(b"slow")
        client.send(b"fast")
        assert readable([client], 10.0) == [client]
        assert client.receive() == b"fast"  # not held behind the slow one
        release.set()
        assert readable([client], 10.0) == [client]
        assert client.receive() == b"slow"
        client.close()
    finally:
        srv.close()


def test_without_overlap_a_slow_message_holds_the_next() -> None:
    order: list[bytes] = []

    async def handle(msg: bytes) -> bytes:
        if msg == b"slow":
            await asyncio.sleep(0.05)
        order.append(msg)
        return msg

    srv = _Server(handle)
    try:
        client = ChannelClient(srv.address, TOKEN)
        client.send(b"slow")
        client.send(b"fast")
        replies = []
        while len(replies) < 2:
            assert readable([client], 10.0)
            replies.append(client.receive())
        assert replies == [b"slow", b"fast"] and order == [b"slow", b"fast"]
        client.close()
    finally:
        srv.close()


def test_a_worker_that_goes_away_is_channel_closed() -> None:
    async def handle(msg: bytes) -> bytes:
        return msg

    srv = _Server(handle)
    client = ChannelClient(srv.address, TOKEN)
    client.send(b"one")
    assert readable([client], 10.0) and client.receive() == b"one"
    srv.close()  # the server and its connections go (as when the worker's process ends)
    assert readable([client], 10.0) == [client]
    with pytest.raises(ChannelClosed):
        client.receive()
    client.close()


def test_connecting_to_nothing_is_an_os_error() -> None:
    import socket

    with socket.socket() as s:  # a port that nobody listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(OSError):
            ChannelClient(("127.0.0.1", port), TOKEN, timeout_s=2.0)
