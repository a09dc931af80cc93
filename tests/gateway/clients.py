"""Client loops for the gateway tests: requests back to back until stopped, each answer
kept as (status, the engine's pid fingerprint), each failure kept apart."""

from __future__ import annotations

import http.client
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WAIT = 40.0
ECHO = Path(__file__).with_name("echo_engine.py")
HELD_READ = 600.0  # s: a held stream's socket timeout (Held.stream)


@dataclass
class Loop:
    """A client sending requests for ``model`` back to back through the gateway."""

    g: Any
    model: str
    # (status, engine pid); for an error answer (status, its message): a failure says which
    answers: list[tuple[int, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    extra: dict[str, Any] = field(default_factory=dict)  # more body fields: stream=True

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                answer = self.g.post(self.model, **self.extra)
            except OSError as exc:  # a reset connection is a failed request too
                self.errors.append(repr(exc))
                continue
            whole = answer.status == 200 and not self.extra.get("stream")
            fingerprint = answer.json().get("system_fingerprint", "") if whole else ""
            self.answers.append((answer.status, fingerprint or _said(answer)))

    def answered_by(self, reconcile: Any, pid: int) -> None:
        """Wait until the engine ``pid`` has answered one of the loop's requests."""
        got = (200, f"pid-{pid}")
        reconcile.wait_for(lambda: got in self.answers, timeout=WAIT, what=f"an answer from {pid}")

    @contextmanager
    def running(self, clients: int = 1) -> Iterator[Loop]:
        """``clients`` threads of this loop, sharing its answers, until the block ends."""
        threads = [threading.Thread(target=self.run, daemon=True) for _ in range(clients)]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=WAIT)


def _said(answer: Any) -> str:
    """An error answer's message (the gateway's OpenAI error body), else ""."""
    if answer.status < 400:
        return ""
    try:
        return str(answer.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return ""


class Stream:
    """One streamed chat answer through the gateway, read in a thread of its own:
    ``begun`` once its first chunk came, ``body`` the whole answer once it ends."""

    def __init__(self, port: int, model: str, timeout: float = WAIT) -> None:
        self.port, self.model, self.timeout = port, model, timeout
        self.begun = threading.Event()
        self.body = b""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            ask = {"model": self.model, "stream": True, "messages": []}
            conn.request("POST", "/v1/chat/completions", body=json.dumps(ask).encode())
            resp = conn.getresponse()
            while line := resp.readline():
                self.body += line
                if line.startswith(b"data: "):
                    self.begun.set()
        except OSError as exc:
            self.body += f"\nfailed: {exc!r}".encode()
        finally:
            self.begun.set()  # an answer that never began must not hang the test
            conn.close()

    def pid(self) -> str:
        return json.loads(self.body.split(b"data: ")[1].split(b"\n")[0])["system_fingerprint"]


def stream_begun(conn: http.client.HTTPConnection, model: str) -> http.client.HTTPResponse:
    """A streamed chat request whose first chunk came: it is in flight at the gateway and
    holds its deployment's slot until read to its end."""
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    conn.request("POST", "/v1/chat/completions", json.dumps(body))
    answer = conn.getresponse()
    assert answer.status == 200, answer.read()
    assert answer.read1(4096).strip(), "the stream's first chunk"
    return answer


class Held:
    """An engine whose streams hold their end until the test releases them: the echo
    engine with ``--hold-while`` (this file) and ``--cut-on-term`` (a SIGTERM cuts them,
    as the demo engine's does). A drain test streams from it, makes its check, then
    releases: it lasts as long as its events. A stream of fixed length (20-30 s) had to
    outlive the drain by a margin, and was waited out whole. Ended whole after
    ``release``, a stream proves its engine was not stopped before its end."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "hold"
        self.path.touch()

    def command(self) -> list[str]:
        """The engine's command (the daemon fills in its port and name)."""
        engine = [sys.executable, str(ECHO), "--port", "{port}", "--model", "{name}"]
        return [*engine, "--hold-while", str(self.path), "--cut-on-term"]

    def stream(self, port: int, model: str) -> Stream:
        """A streamed answer through the gateway on ``port``, read with a socket timeout
        past any wait a loaded box makes before its release (nothing comes meanwhile: the
        reader's 40 s cut a held stream at load 20+); each test's joins bound it."""
        return Stream(port, model, timeout=HELD_READ)

    def release(self) -> None:
        """The streams held end (each within the engine's poll of the file, 50 ms)."""
        self.path.unlink(missing_ok=True)
