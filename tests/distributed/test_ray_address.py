"""A ``--ray HOST:PORT`` where no Ray cluster answers is one line in seconds: nothing
listening, or something else (an HTTP server, a silent socket) listening there."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from loomrl.distributed.cluster import RayAddressError, _check_reachable


@pytest.fixture
def http_port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_an_http_server_is_not_a_ray_cluster(http_port):
    for address in (f"127.0.0.1:{http_port}", f"ray://127.0.0.1:{http_port}"):
        started = time.monotonic()
        with pytest.raises(RayAddressError, match="is not a Ray cluster: something else listens"):
            _check_reachable(address)
        assert time.monotonic() - started < 5


def test_a_silent_listener_is_not_a_ray_cluster():
    with socket.create_server(("127.0.0.1", 0)) as server:  # accepts, never answers
        port = server.getsockname()[1]
        with pytest.raises(RayAddressError, match="is not a Ray cluster"):
            _check_reachable(f"127.0.0.1:{port}", timeout_s=0.5)


def test_nothing_listening_cannot_be_reached():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    with pytest.raises(RayAddressError, match="cannot reach the Ray cluster"):
        _check_reachable(f"127.0.0.1:{port}")


def test_a_ray_cluster_answers(ray_cluster):
    _check_reachable(ray_cluster.address)  # the GCS: gRPC
