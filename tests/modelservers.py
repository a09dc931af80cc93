"""Local servers for model pulls: a file server with Range, and enough of the HF hub.

Both are real HTTP servers on 127.0.0.1 in a thread of the test process (started and
stopped by the ``with`` block): the pull process talks to them over sockets as it
would to a mirror or to huggingface.co.

``FileServer`` serves named byte strings with ``Range`` (206, Content-Range) and
``HEAD``, counts the bytes it sent and the Range headers it saw; ``cut_after`` makes it
drop the first connection after that many bytes, ``hold`` makes it stop sending after
that many bytes until released (a pull that is mid-way for as long as the test wants);
``auth="user:password"`` answers 401 to a GET or HEAD without that Basic auth
(``authorizations``: the header of each request, None where it had none).

``HubServer`` answers what ``huggingface_hub``'s ``snapshot_download`` asks, with
``HF_ENDPOINT`` pointed at it: ``GET /api/models/{repo}/revision/{rev}`` (the commit),
``GET /api/models/{repo}/tree/{commit}`` (the files, their sizes and oids), and
``HEAD``/``GET /{repo}/resolve/{rev}/{file}`` with ``X-Repo-Commit``, ``ETag`` and
``Content-Length``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class _Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None  # the test's output stays the test's


class FileServer:
    def __init__(
        self,
        files: dict[str, bytes],
        *,
        cut_after: int | None = None,
        hold: int | None = None,
        auth: str | None = None,
    ) -> None:
        self.files = files
        self.auth = None if auth is None else "Basic " + base64.b64encode(auth.encode()).decode()
        self.authorizations: list[str | None] = []  # each request's Authorization header
        self.cut_after = cut_after
        self.hold_at = hold
        self.released = threading.Event()
        self.ranges: list[str] = []
        self.sent = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/{name}"

    def release(self) -> None:
        self.released.set()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(_Quiet):
            def do_GET(self) -> None:
                if server._let_in(self):
                    server._serve(self)

            def do_HEAD(self) -> None:
                if server._let_in(self):
                    server._head(self)

        return Handler

    def _let_in(self, handler: BaseHTTPRequestHandler) -> bool:
        self.authorizations.append(handler.headers.get("Authorization"))
        if self.auth is None or handler.headers.get("Authorization") == self.auth:
            return True
        handler.send_response(401)
        handler.send_header("WWW-Authenticate", 'Basic realm="models"')
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return False

    def _head(self, handler: BaseHTTPRequestHandler) -> None:
        """What ``plan`` asks before a pull: the size, no body (and no request counted)."""
        data = self.files.get(handler.path.split("?")[0].lstrip("/"))
        if data is None:
            handler.send_error(404)
            return
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("Accept-Ranges", "bytes")
        handler.end_headers()

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        data = self.files.get(handler.path.split("?")[0].lstrip("/"))
        with self._lock:
            self.requests += 1
            first = self.requests == 1
        if data is None:
            handler.send_error(404)
            return
        start = _range_start(handler, data, self.ranges)
        if start is None:
            return
        body = data[start:]
        handler.send_header("Content-Length", str(len(body)))
        handler.send_header("Accept-Ranges", "bytes")
        handler.end_headers()
        self._send(handler, body, cut=self.cut_after if first else None)

    def _send(self, handler: BaseHTTPRequestHandler, body: bytes, *, cut: int | None) -> None:
        step = 64 * 1024
        for at in range(0, len(body), step):
            if cut is not None and at >= cut:
                handler.close_connection = True
                handler.connection.shutdown(2)  # a cut mid-body: the client sees a short read
                return
            if self.hold_at is not None and at >= self.hold_at:
                self.released.wait()
            chunk = body[at : at + step]
            try:
                handler.wfile.write(chunk)
            except OSError:
                return  # the client went away (a pull killed mid-way)
            with self._lock:
                self.sent += len(chunk)

    def __enter__(self) -> FileServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()


def _range_start(handler: BaseHTTPRequestHandler, data: bytes, seen: list[str]) -> int | None:
    """Send the status line for a whole or ranged answer; the first byte to send."""
    header = handler.headers.get("Range")
    if header is None:
        handler.send_response(200)
        return 0
    seen.append(header)
    match = RANGE.match(header)
    start = int(match.group(1)) if match else -1
    if not 0 <= start < len(data):
        handler.send_response(416)
        handler.send_header("Content-Range", f"bytes */{len(data)}")
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return None
    handler.send_response(206)
    handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
    return start


class HubServer:
    """One repo (``repo``) at one commit, holding ``files``; ``gated``: a request without
    a token gets the hub's 401 with ``X-Error-Code: GatedRepo``; ``endless``: a file's GET
    streams its bytes over and over, with no Content-Length, until the client goes (a
    mirror that sends more than its listing says); ``hold``: a file's GET sends that many
    bytes, then waits for :meth:`release` (a pull caught mid-way)."""

    def __init__(
        self,
        repo: str,
        files: dict[str, bytes],
        *,
        gated: bool = False,
        endless: bool = False,
        hold: int | None = None,
    ) -> None:
        self.repo = repo
        self.files = files
        self.gated = gated
        self.endless = endless
        self.hold_at = hold
        self.released = threading.Event()
        self.sent = 0  # bytes a file's GET sent
        self.streamed = 0  # bytes an endless GET sent
        self._closing = threading.Event()
        self.downloads: list[str] = []  # file names GET /resolve sent in full or in part
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(_Quiet):
            def do_GET(self) -> None:
                hub._route(self, body=True)

            def do_HEAD(self) -> None:
                hub._route(self, body=False)

        return Handler

    def _route(self, handler: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = handler.path.split("?", 1)[0]
        if self.gated and not handler.headers.get("Authorization"):
            handler.send_response(401)
            handler.send_header("X-Error-Code", "GatedRepo")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        api = f"/api/models/{self.repo}/"
        if path.startswith(api + "revision/"):
            self._json(handler, {"id": self.repo, "sha": COMMIT, "siblings": self._siblings()})
        elif path.startswith(api + "tree/"):
            self._json(handler, self._tree())
        elif path.startswith(f"/{self.repo}/resolve/"):
            name = path.split("/resolve/", 1)[1].split("/", 1)[1]
            self._file(handler, name, body=body)
        else:
            handler.send_error(404)

    def _siblings(self) -> list[dict[str, str]]:
        return [{"rfilename": name} for name in sorted(self.files)]

    def _tree(self) -> list[dict[str, Any]]:
        return [
            {"type": "file", "path": name, "size": len(data), "oid": _git_oid(data)}
            for name, data in sorted(self.files.items())
        ]

    def _json(self, handler: BaseHTTPRequestHandler, value: Any) -> None:
        raw = json.dumps(value).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(raw)))
        handler.end_headers()
        handler.wfile.write(raw)

    def _file(self, handler: BaseHTTPRequestHandler, name: str, *, body: bool) -> None:
        data = self.files.get(name)
        if data is None:
            handler.send_response(404)
            handler.send_header("X-Error-Code", "EntryNotFound")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        start = _range_start(handler, data, []) if body else 0
        if start is None:
            return
        if not body:
            handler.send_response(200)
        handler.send_header("X-Repo-Commit", COMMIT)
        handler.send_header("ETag", f'"{_git_oid(data)}"')
        if body and self.endless:
            handler.end_headers()  # HTTP/1.0 without a length: the body ends at the close
            self.downloads.append(name)
            self._stream(handler, data)
            return
        handler.send_header("Content-Length", str(len(data) - start))
        handler.end_headers()
        if body:
            self.downloads.append(name)
            self._send(handler, data[start:])

    def release(self) -> None:
        self.released.set()

    def _send(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        held = len(body) if self.hold_at is None else self.hold_at
        with contextlib.suppress(OSError):  # the client went away (a pull stopped mid-way)
            handler.wfile.write(body[:held])
            handler.wfile.flush()
            self.sent += len(body[:held])
            if held < len(body):
                self.released.wait()
                handler.wfile.write(body[held:])

    def _stream(self, handler: BaseHTTPRequestHandler, data: bytes) -> None:
        with contextlib.suppress(OSError):
            while not self._closing.is_set():
                handler.wfile.write(data)
                self.streamed += len(data)

    def __enter__(self) -> HubServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self.released.set()
        self._server.shutdown()
        self._server.server_close()


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HostileServer:
    """One URL, answered the way a broken or hostile server would (``mode``):

    ``endless``: 200 with no Content-Length, then bytes until the client goes away;
    ``trickle``: 200 with a Content-Length, then one byte every ``every`` seconds;
    ``ftp``: a 302 to an ``ftp://`` URL; ``bad-range``: a ranged request answered 206
    with a Content-Range (and body) that starts at half the byte asked for;
    ``range-from-zero``: 206 with the whole of ``data`` whatever was asked; ``missing``:
    404; anything else: ``data`` whole. ``sent`` counts the body bytes written.
    """

    def __init__(self, mode: str, data: bytes = b"", *, every: float = 0.2) -> None:
        self.mode = mode
        self.data = data
        self.every = every
        self.sent = 0
        self.stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    def url(self, name: str = "tiny.gguf") -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/{name}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(_Quiet):
            def do_GET(self) -> None:
                try:
                    getattr(server, "_" + server.mode.replace("-", "_"), server._whole)(self)
                except OSError:
                    return  # the client went away: what a pull that gives up does

        return Handler

    def _write(self, handler: BaseHTTPRequestHandler, chunk: bytes) -> None:
        handler.wfile.write(chunk)
        handler.wfile.flush()
        self.sent += len(chunk)

    def _whole(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(self.data)))
        handler.end_headers()
        self._write(handler, self.data)

    def _endless(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Connection", "close")  # no length: the body ends with it
        handler.end_headers()
        handler.close_connection = True
        while not self.stop.is_set():
            self._write(handler, b"x" * (256 * 1024))

    def _trickle(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(self.data)))
        handler.end_headers()
        for byte in self.data:
            if self.stop.wait(self.every):
                return
            self._write(handler, bytes([byte]))

    def _ftp(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(302)
        handler.send_header("Location", "ftp://127.0.0.1:1/tiny.gguf")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def _missing(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_error(404)

    def _range_from_zero(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(206)
        handler.send_header("Content-Range", f"bytes 0-{len(self.data) - 1}/{len(self.data)}")
        handler.send_header("Content-Length", str(len(self.data)))
        handler.end_headers()
        self._write(handler, self.data)

    def _bad_range(self, handler: BaseHTTPRequestHandler) -> None:
        match = RANGE.match(handler.headers.get("Range", ""))
        if match is None:
            self._whole(handler)
            return
        wrong = int(match.group(1)) // 2  # not the byte asked for, and says so
        body = self.data[wrong:]
        handler.send_response(206)
        handler.send_header("Content-Range", f"bytes {wrong}-{len(self.data) - 1}/{len(self.data)}")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        self._write(handler, body)

    def __enter__(self) -> HostileServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def serving(files: dict[str, bytes], **options: Any) -> Iterator[FileServer]:
    with FileServer(files, **options) as server:
        yield server
