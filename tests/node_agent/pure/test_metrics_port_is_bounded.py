"""The agent's /metrics port bounds what a client can hold: idle and slow connections are closed,
and a flood of them never piles up threads or locks out /healthz."""

from __future__ import annotations

import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from devcluster.waiting import wait_for
from node_agent.metrics import AgentMetrics, BoundedHTTPServer, Health, serve


@pytest.fixture
def server() -> Iterator[BoundedHTTPServer]:
    srv = serve("127.0.0.1:0", AgentMetrics(), Health(60.0), idle_timeout_s=0.5, deadline_s=2.0, max_connections=4)
    yield srv
    srv.shutdown()
    srv.server_close()


def _handler_threads(server: BoundedHTTPServer) -> int:
    """Threads serving a connection of ``server`` (other tests' servers may still have their own)."""

    def serves_a_connection_of_server(thread: threading.Thread) -> bool:
        target = getattr(thread, "_target", None)  # unset once the thread has ended
        return getattr(target, "__self__", None) is server and "process_request_thread" in thread.name

    return sum(1 for t in threading.enumerate() if serves_a_connection_of_server(t))


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
        return int(resp.status)


def test_a_flood_of_idle_connections_holds_no_more_threads_than_the_cap(
    server: BoundedHTTPServer, capfd: pytest.CaptureFixture[str]
) -> None:
    port = server.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
    try:
        time.sleep(0.3)
        assert _healthz(port) == 200, "a new request is served even with every slot taken"
        assert _handler_threads(server) <= 4 + 1, f"{_handler_threads(server)} handler threads for 40 idle connections"
        assert server.open_connections <= 4
        assert all(_closed_by_server(s, 3.0) for s in idle), "every idle connection is closed"
        # a handler thread ends shortly after its connection closes; on a loaded machine that can
        # take longer than any fixed sleep, so wait for it (bounded) instead
        wait_for(lambda: _handler_threads(server) == 0, 10, "every handler thread ended")
        assert "Traceback" not in capfd.readouterr().err, "a client cut off is no error of the agent's"
    finally:
        for s in idle:
            s.close()


def test_an_idle_connection_is_closed_after_the_idle_timeout(server: BoundedHTTPServer) -> None:
    with socket.create_connection(("127.0.0.1", server.server_address[1])) as sock:
        start = time.monotonic()
        assert _closed_by_server(sock, 3.0)
        assert time.monotonic() - start < 2.0


def test_a_slow_drip_is_shut_down_at_the_connection_deadline(server: BoundedHTTPServer) -> None:
    with socket.create_connection(("127.0.0.1", server.server_address[1])) as sock:
        start = time.monotonic()
        request = b"GET /metrics HTTP/1.1\r\n" + b"X-Slow: " + b"a" * 200
        closed = False
        for byte in request:  # one byte every 0.2 s: never idle for the 0.5 s idle timeout
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            sock.settimeout(0.2)
            try:
                if sock.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
        assert closed, "the server kept a slow client for the whole request"
        assert time.monotonic() - start < 4.0


def test_a_client_that_resets_its_connection_leaves_no_traceback(
    server: BoundedHTTPServer, capfd: pytest.CaptureFixture[str]
) -> None:
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", server.server_address[1]))
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset, not a clean close
    time.sleep(1.0)
    assert _healthz(server.server_address[1]) == 200
    assert "Traceback" not in capfd.readouterr().err
