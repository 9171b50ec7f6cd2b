"""A direct TCP connection from the master to each worker, for batches and their results.

Why: a Ray actor call and its reply cross several threads in each process (the caller's submit
path, gRPC's polling threads, the actor's task-execution thread). On the 2-core VM a batch call to
each of two workers and both replies took 1.2 ms, of which the worker's Python saw the request only
0.72 ms after the master sent it; the same two round trips over plain loopback sockets took
0.08 ms. A synchronous iteration is one such round trip, so `RuntimeConfig.direct_channel` (the
default) sends batches this way. Everything else — creating, placing and killing actors, moving
executors, reading and committing to the shards, checkpoints — stays on Ray.

The protocol: the master connects to the address the worker's asyncio server listens on (the
worker's node IP, an ephemeral port) and first sends a random token that it gave the worker through
Ray (so only the master's process can drive the worker); then each message in either direction is
an 8-byte big-endian length and that many bytes (the `pack`-ed batch, the `pack`-ed result). The
worker answers each batch once, with the batch id inside the result, and never blocks on writing
(asyncio buffers the replies), so the master's blocking send cannot deadlock with it. A worker that
dies closes its socket (the master reads EOF and treats it as a lost actor); a worker that vanishes
without closing it (a lost node) is noticed through Ray (`LitzWorkerActor.watch`).
"""

from __future__ import annotations

import asyncio
import hmac
import math
import select
import socket
from collections.abc import Awaitable, Callable, Iterable

HEADER = 8  # bytes of the big-endian length before each message
TOKEN_BYTES = 32


class ChannelClosed(ConnectionError):
    """The worker's end of a channel closed (its process ended) or the connection broke."""


async def serve(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    token: bytes,
    handle: Callable[[bytes], Awaitable[bytes]],
    overlap: bool,
) -> None:
    """One master connection: check its token, then answer every message with `handle(message)`,
    one at a time in arrival order (or, with `overlap`, each as soon as it is done)."""

    def reply(data: bytes) -> None:
        writer.write(len(data).to_bytes(HEADER, "big"))
        writer.write(data)

    async def one(message: bytes) -> None:
        reply(await handle(message))

    pending: set[asyncio.Task[None]] = set()
    try:
        if not hmac.compare_digest(await reader.readexactly(len(token)), token):
            return
        while True:
            n = int.from_bytes(await reader.readexactly(HEADER), "big")
            message = await reader.readexactly(n)
            if overlap:
                task = asyncio.ensure_future(one(message))
                pending.add(task)
                task.add_done_callback(pending.discard)
            else:
                await one(message)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the master went away (its run ended, or it was killed)
    finally:
        writer.close()


class ChannelClient:
    """The master's end of one worker's channel (a blocking socket, read after `select`)."""

    def __init__(self, address: tuple[str, int], token: bytes, timeout_s: float = 10.0) -> None:
        self.address = address
        self.sock = socket.create_connection(address, timeout=timeout_s)
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._header = bytearray(HEADER)
        self.send_raw(token)

    def fileno(self) -> int:
        return self.sock.fileno()

    def send_raw(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as err:
            raise ChannelClosed(f"channel to {self.address}: send failed: {err}") from err

    def send(self, message: bytes) -> None:
        self.send_raw(len(message).to_bytes(HEADER, "big") + message)

    def _read_into(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            try:
                n = self.sock.recv_into(view[got:])
            except OSError as err:
                raise ChannelClosed(f"channel to {self.address}: receive failed: {err}") from err
            if n == 0:
                raise ChannelClosed(f"channel to {self.address}: closed by the worker")
            got += n

    def receive(self) -> bytearray:
        """The next message (blocks until all of it is here)."""
        self._read_into(memoryview(self._header))
        body = bytearray(int.from_bytes(self._header, "big"))
        self._read_into(memoryview(body))
        return body

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def readable(clients: Iterable[ChannelClient], timeout: float) -> list[ChannelClient]:
    """The clients with a message (or EOF) waiting, after at most `timeout` seconds.

    `poll`, not `select`: a Ray driver holds many descriptors, and `select` fails on one >= 1024."""
    by_fd = {c.fileno(): c for c in clients}
    if not by_fd:
        return []
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    events = poller.poll(max(0, math.ceil(timeout * 1000)))
    return [by_fd[fd] for fd, _ in events]
