"""The job's HTTP client keeps its connections alive: one per thread and host, reused while the server keeps it
open, opened afresh when the server closed it meanwhile; a real HTTP/1.1 server on loopback."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from notifier.http import close_connections, request


class Server:
    def __init__(self) -> None:
        self.connections = 0
        self.close_after_next = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                server.connections += 1

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                out = b'{"got": %d}' % len(body)
                self.send_response(202)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                if server.close_after_next:  # the server's keep-alive timeout, without telling the client
                    server.close_after_next = False
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    close_connections()
    s.stop()


def test_one_connection_per_thread_reused_and_reopened_when_the_server_closed_it(server, monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    for i in range(20):
        r = request(server.url + "/v1/ingest", b"x" * i, token="t", timeout=5.0)
        assert (r.status, r.body) == (202, b'{"got": %d}' % i)
    assert server.connections == 1
    server.close_after_next = True
    assert request(server.url + "/v1/ingest", b"a", token="t", timeout=5.0).status == 202
    assert request(server.url + "/v1/ingest", b"b", token="t", timeout=5.0).status == 202  # on a new connection
    assert server.connections == 2
    other: list[int] = []
    t = threading.Thread(target=lambda: other.append(request(server.url + "/x", b"c", token=None, timeout=5.0).status))
    t.start()
    t.join()
    assert other == [202] and server.connections == 3  # another thread: a connection of its own


def test_through_a_proxy_urllib_sends_it_as_before(server, monkeypatch):
    import urllib.request

    monkeypatch.setenv("http_proxy", server.url)  # the "proxy" answers the request itself
    monkeypatch.setenv("no_proxy", "")
    # urlopen's opener reads the proxies once, when it is built: a fresh one here, and the process's own put back
    # afterwards (else every later urlopen in this process would go through this test's proxy)
    # (built here with the proxy named, not left for urlopen to build from the environment: a thread of an earlier
    # test in this worker building the shared opener at the wrong moment made this test flaky under xdist)
    monkeypatch.setattr(urllib.request, "_opener", urllib.request.build_opener(
        urllib.request.ProxyHandler({"http": server.url})))
    r = request("http://bot.invalid/v1/ingest", b"xyz", token="t", timeout=5.0)
    assert (r.status, r.body) == (202, b'{"got": 3}')
