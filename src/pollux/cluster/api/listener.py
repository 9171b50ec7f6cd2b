"""The socket the service's API listens on.

uvicorn is handed a bound socket (so the service knows its port before the API starts). asyncio
turns Nagle's algorithm off only on sockets whose protocol is ``IPPROTO_TCP``, and a socket made as
``socket(AF_INET, SOCK_STREAM)`` reports protocol 0, so the connections it accepted kept Nagle on:
a response's head and body went out as two writes, the body waited for the head's ACK, and the
client delayed that ACK by 40 ms. Every request on a kept-alive connection (the CLI, an agent's
hints, a browser, a Prometheus scrape) paid it. Here the protocol is named and ``TCP_NODELAY`` is set
on the listening socket, which Linux passes on to each socket it accepts.
"""

from __future__ import annotations

import socket

__all__ = ["api_socket"]


def api_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``(host, port)`` (port 0: any free one), not yet listening, with
    ``SO_REUSEADDR`` and ``TCP_NODELAY``; raises :class:`OSError` where it cannot bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
