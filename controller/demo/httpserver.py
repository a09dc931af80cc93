"""The demo engine's HTTP/1.1 server, on ``socketserver``: what the engine used of
``http.server`` (a request line and headers read, keep-alive, ``Expect: 100-continue``,
an answer's head built with ``send_response``/``send_header``/``end_headers``, one log
line per answer) without its imports. ``http.server`` brings ``http.client``, ``email``,
``ssl``, ``html`` and ``mimetypes``: about two thirds of a demo engine's start, and the
test suite starts demo engines ~1,700 times a run.

A subclass of :class:`Handler` answers with ``do_GET``, ``do_POST`` (any method it lacks
is a 501), as a ``BaseHTTPRequestHandler`` subclass does; :class:`Server` runs one thread
per connection.
"""

from __future__ import annotations

import json
import socketserver
import sys
import time
from collections.abc import Callable

MAX_LINE = 65536  # a request or header line longer than this is refused (http.server's)
MAX_HEADERS = 100  # more header lines than this are refused (http.client's)
# http.server's own words (BaseHTTPRequestHandler.version_string), kept: clients know the
# demo engine's answers by them (tests/harness/test_gateway_fuzz.py tells its from the
# gateway's).
SERVER = f"BaseHTTP/0.6 Python/{sys.version.split()[0]}"
REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    414: "Request-URI Too Long",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
# RFC 9110's date: English names whatever the locale (strftime's %a and %b follow it).
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class Refused(Exception):
    """A request that cannot be read: answered with ``code`` and the connection closed."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


def http_date(seconds: float) -> str:
    """``Date``'s form: ``Sun, 06 Nov 1994 08:49:37 GMT``."""
    t = time.gmtime(seconds)
    day, month = DAYS[t.tm_wday], MONTHS[t.tm_mon - 1]
    return f"{day}, {t.tm_mday:02d} {month} {t.tm_year} {time.strftime('%H:%M:%S', t)} GMT"


class Handler(socketserver.StreamRequestHandler):
    """One connection: its requests read and answered in turn until either side closes
    it (HTTP/1.1 keeps it open unless ``Connection: close``; HTTP/1.0 closes it unless
    ``Connection: keep-alive``)."""

    command = ""
    path = ""
    requestline = ""
    close_connection = True

    def handle(self) -> None:
        self.close_connection = False
        while not self.close_connection:
            self.handle_one_request()

    def handle_one_request(self) -> None:
        self.close_connection = True  # until the request says it keeps the connection
        self.headers: dict[str, str] = {}  # names in lower case
        self._head: list[bytes] = []
        line = self.rfile.readline(MAX_LINE + 1)
        if not line:
            return  # the client closed the connection
        try:
            self._read_request(line)
        except Refused as refused:
            self._refuse(refused.code, str(refused))
            return
        answer: Callable[[], None] | None = getattr(self, f"do_{self.command}", None)
        if answer is None:
            self._refuse(501, f"Unsupported method ({self.command!r})")
            return
        answer()
        self.wfile.flush()

    def _read_request(self, line: bytes) -> None:
        if len(line) > MAX_LINE:
            raise Refused(414, "request line too long")
        self.requestline = line.decode("iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if len(words) != 3 or not words[2].startswith("HTTP/"):
            raise Refused(400, f"bad request line {self.requestline!r}")
        self.command, self.path, version = words
        number = _version(version)
        self._read_headers()
        connection = self.headers.get("connection", "").lower()
        self.close_connection = connection == "close" or (
            number < (1, 1) and connection != "keep-alive"
        )
        if number >= (1, 1) and self.headers.get("expect", "").lower() == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.wfile.flush()  # the client waits for it before it sends the body

    def _read_headers(self) -> None:
        for _ in range(MAX_HEADERS + 1):
            line = self.rfile.readline(MAX_LINE + 1)
            if len(line) > MAX_LINE:
                raise Refused(431, "header line too long")
            if line in (b"\r\n", b"\n", b""):
                return
            name, colon, value = line.decode("iso-8859-1").partition(":")
            if not colon:
                raise Refused(400, f"bad header line {line[:80]!r}")
            self.headers[name.strip().lower()] = value.strip()
        raise Refused(431, f"more than {MAX_HEADERS} headers")

    def _refuse(self, code: int, why: str) -> None:
        body = json.dumps({"error": why}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def send_response(self, code: int) -> None:
        """An answer's status line, with ``Server`` and ``Date``; logged as it starts."""
        self.log_message('"%s" %s %s', self.requestline, str(code), "-")
        self._head = [f"HTTP/1.1 {code} {REASONS.get(code, '')}\r\n".encode("latin-1")]
        self.send_header("Server", SERVER)
        self.send_header("Date", http_date(time.time()))

    def send_header(self, name: str, value: str) -> None:
        self._head.append(f"{name}: {value}\r\n".encode("latin-1"))
        if name.lower() == "connection":
            self.close_connection = value.lower() == "close"

    def end_headers(self) -> None:
        """The head, written as one piece (with a buffered wfile, the body joins it)."""
        self._head.append(b"\r\n")
        self.wfile.write(b"".join(self._head))
        self._head = []

    def address_string(self) -> str:
        return str(self.client_address[0])

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")


def _version(text: str) -> tuple[int, int]:
    """``HTTP/1.1`` → ``(1, 1)``; HTTP/2 and later are not spoken here (505)."""
    major, dot, minor = text[5:].partition(".")
    if not (major.isdigit() and minor.isdigit() and dot):
        raise Refused(400, f"bad HTTP version {text!r}")
    number = (int(major), int(minor))
    if number >= (2, 0):
        raise Refused(505, f"HTTP version {text} is not served")
    return number


class Server(socketserver.ThreadingTCPServer):
    """One thread per connection; a restarted engine binds its port again at once."""

    allow_reuse_address = True
    daemon_threads = True
