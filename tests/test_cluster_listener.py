"""The API's listening socket: Nagle off on every connection it accepts (see
:mod:`pollux.cluster.api.listener` for the 40 ms it cost each kept-alive request)."""

from __future__ import annotations

import socket

import httpx
import pytest
from fastapi import FastAPI

from api_helpers import serve_on_loopback
from pollux.cluster.api.listener import api_socket


def test_accepted_connections_have_nodelay():
    with api_socket("127.0.0.1", 0) as server:
        assert server.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert server.proto == socket.IPPROTO_TCP     # asyncio sets TCP_NODELAY only on these
        server.listen(1)
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
                client.sendall(b"x")
                assert accepted.recv(1) == b"x"


def test_a_taken_port_is_an_error_and_leaves_no_socket():
    with api_socket("127.0.0.1", 0) as taken:
        taken.listen(1)
        with pytest.raises(OSError):
            api_socket("127.0.0.1", taken.getsockname()[1]).close()


def test_kept_alive_requests_reach_uvicorn_through_it():
    """uvicorn serves on the socket as the service hands it over (the tests' server helper uses it
    too): several requests on one kept-alive connection, each answered whole. The 40 ms itself is
    a timing and is measured by ``benchmarks/views_load.py``, not asserted here."""
    app = FastAPI()

    @app.get("/ping")
    def ping() -> dict[str, str]:
        return {"pong": "x" * 20_000}

    with serve_on_loopback(app) as url, httpx.Client(base_url=url) as client:
        answers = [client.get("/ping") for _ in range(5)]
    assert all(a.status_code == 200 and len(a.json()["pong"]) == 20_000 for a in answers)
