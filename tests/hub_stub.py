"""A local Hugging Face-compatible HTTP server for tests (what huggingface_hub's ``hf_hub_download``
and ``list_repo_files`` call): HEAD and GET on ``/{repo}/resolve/{revision}/{file}`` with range
requests and the Hub's X-Error-Code 404s, plus ``GET /api/models/{repo}/tree/{revision}``.
Shared by test_pull.py, test_catalog.py and test_checkpoint_repair.py (fixtures in conftest.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import contextlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self) -> None:
        self.files: dict[tuple[str, str], bytes] = {}
        self.truncate_next: dict[tuple[str, str], int] = {}   # (repo, file) -> bytes sent before closing
        self.log: list[tuple[str, str, str | None]] = []       # (method, path, Range header)
        self.lock = threading.Lock()

    def add(self, repo: str, name: str, data: bytes) -> str:
        self.files[(repo, name)] = data
        return hashlib.sha256(data).hexdigest()


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"   # one request per connection: a cut body is a closed socket

        def log_message(self, *args) -> None:  # keep test output quiet
            pass

        def _lookup(self):
            m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", self.path.split("?")[0])
            if m is None:
                return None, None, None
            repo, rev, name = m.group(1), m.group(2), m.group(3)
            if not any(r == repo for r, _ in hub.files):
                return repo, "RepoNotFound", None
            if rev not in ("main", COMMIT):
                return repo, "RevisionNotFound", None
            data = hub.files.get((repo, name))
            return (repo, name), ("EntryNotFound" if data is None else None), data

        def _error(self, code: str | None) -> None:
            self.send_response(404)
            if code:
                self.send_header("X-Error-Code", code)
            if code == "EntryNotFound":
                self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _headers(self, data: bytes, status: int = 200, start: int = 0) -> None:
            self.send_response(status)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()

        def do_HEAD(self) -> None:
            key, err, data = self._lookup()
            with hub.lock:
                hub.log.append(("HEAD", self.path, None))
            if data is None:
                return self._error(err)
            self._headers(data)

        def do_GET(self) -> None:
            key, err, data = self._lookup()
            rng = self.headers.get("Range")
            with hub.lock:
                hub.log.append(("GET", self.path, rng))
                cut = hub.truncate_next.pop(key, None) if data is not None else None
            if data is None:
                return self._error(err)
            start = 0
            if rng:
                m = re.match(r"bytes=(\d+)-$", rng)
                assert m, rng
                start = int(m.group(1))
            self._headers(data, 206 if rng else 200, start)
            body = data[start:]
            if cut is not None:   # send part of the body, then drop the connection
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    return Handler


def _listing_handler(fake: FakeHub):
    base = _handler(fake)

    class Handler(base):  # type: ignore[misc, valid-type]
        def do_GET(self) -> None:
            m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/?]+)", self.path)
            if m is None:
                return super().do_GET()
            repo, rev = m.group(1), unquote(m.group(2))
            with fake.lock:
                fake.log.append(("GET", self.path, None))
            if not any(r == repo for r, _ in fake.files):
                return self._error("RepoNotFound")
            if rev not in ("main", COMMIT):
                return self._error("RevisionNotFound")
            body = json.dumps([
                {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                for (r, name), data in sorted(fake.files.items()) if r == repo
            ]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler



@contextlib.contextmanager
def serving(handler, home, monkeypatch):
    """Serve ``handler`` on a local port as the Hugging Face endpoint, with huggingface_hub's cache
    under ``home`` and online mode on (conftest sets offline for every test)."""
    import huggingface_hub.constants as hf_constants

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    # huggingface_hub reads HF_HUB_OFFLINE and fixes its cache path once, at import
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(home / "hf" / "hub"))
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
