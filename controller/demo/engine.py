"""A stand-in inference engine for demos and tests, a small but faithful OpenAI server:
/health, /v1/models, ``/v1/completions``, ``/v1/chat/completions`` (``"stream": true``
too) and ``/v1/embeddings``, each answer with ``id``, ``object``, ``created``, ``model``
and ``usage``, so token metrics and every client path can be tried without a model.

    python -m controller.demo.engine --port 8000 [--host 127.0.0.1] [--load-seconds 1]
        [--chunks 3] [--chunk-delay 0.05] [--metrics-file PATH] [--slots N]

It "loads" for ``--load-seconds`` (``/health`` answers 503 meanwhile, like
llama.cpp), then serves. A streamed answer sends ``--chunks`` server-sent events
``--chunk-delay`` seconds apart (chunked, as real engines send them), the last with
``finish_reason: "stop"``, then (when
``stream_options.include_usage`` asks, as OpenAI does) a chunk with no choices and the
usage. A token is a whitespace-separated word. An embedding is a unit vector made from
the input's SHA-256 (the same input, the same vector; ``dimensions`` sets its length,
default 16; ``encoding_format: base64`` packs float32, as the ``openai`` client asks).
With ``--slots N`` it streams N answers at once and the others wait, as an engine's
batch does, and GET /metrics says how many run and wait (vLLM's series). Every answer
says which engine process made it (``system_fingerprint``: its pid) so
tests can tell instances apart. Any other POST path gets a completion. SIGTERM ends it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import os
import signal
import struct
import sys
import threading
import time

from controller.demo.httpserver import Handler, Server

# typing.TYPE_CHECKING without importing typing (~5% of this engine's start): the names
# below are only ever read by the type checker (annotations are strings here).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    Json = dict[str, Any]

DIMENSIONS = 16  # an embedding's length unless the request's `dimensions` says otherwise


def tokens(text: str) -> int:
    """The demo's token count: whitespace-separated words."""
    return len(text.split())


def usage(prompt: int, completion: int | None = None) -> Json:
    """OpenAI's usage object (an embedding has no completion tokens)."""
    if completion is None:
        return {"prompt_tokens": prompt, "total_tokens": prompt}
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def prompt_text(request: Json, chat: bool) -> str:
    """The words a request asks about: its messages' text, or its prompt(s)."""
    if chat:
        messages = request.get("messages")
        parts = [_text(m.get("content")) for m in messages or [] if isinstance(m, dict)]
        return " ".join(parts)
    return _text(request.get("prompt"))


def _text(value: Any) -> str:
    """A prompt, a message's content: a string, a list of strings or of content parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(_text(v.get("text") if isinstance(v, dict) else v) for v in value)
    return ""


def embedding(text: str, dimensions: int) -> list[float]:
    """A deterministic unit vector for ``text``: SHA-256 blocks read as signed bytes."""
    import hashlib  # here: it loads OpenSSL's libcrypto, which no other answer needs

    digest = b""
    for block in itertools.count():
        if len(digest) >= dimensions:
            break
        digest += hashlib.sha256(f"{block}:{text}".encode()).digest()
    values = [(b - 127.5) / 127.5 for b in digest[:dimensions]]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [round(v / norm, 6) for v in values]


def embeddings_answer(request: Json, model: str) -> Json:
    """``/v1/embeddings``: one item per input (a string or a list of them)."""
    raw = request.get("input")
    inputs = raw if isinstance(raw, list) else [raw]
    texts = [_input_text(i) for i in inputs]
    size = request.get("dimensions")
    size = size if isinstance(size, int) and 0 < size <= 4096 else DIMENSIONS
    packed = request.get("encoding_format") == "base64"
    data = []
    for index, text in enumerate(texts):
        vector = embedding(text, size)
        shown: Any = _base64(vector) if packed else vector
        data.append({"object": "embedding", "index": index, "embedding": shown})
    used = usage(sum(tokens(t) for t in texts))
    return {"object": "list", "data": data, "model": model, "usage": used}


def _input_text(value: Any) -> str:
    """An embedding's input: text, or token ids (each id a token here)."""
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return " ".join(str(v) for v in value)
    return _text(value)


def _base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


class Slots:
    """``--slots N``: N answers at once, as an engine's batch; the others wait their turn,
    and GET /metrics says how many run and wait in vLLM's series (what the gateway reads
    for ``autoscale.metric: waiting`` and prefix routing)."""

    def __init__(self, count: int) -> None:
        self._free = threading.Semaphore(count)
        self._lock = threading.Lock()
        self.running = 0
        self.waiting = 0

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            self.waiting += 1
        self._free.acquire()
        with self._lock:
            self.waiting -= 1
            self.running += 1
        try:
            yield
        finally:
            with self._lock:
                self.running -= 1
            self._free.release()

    def metrics(self) -> bytes:
        with self._lock:
            running, waiting = self.running, self.waiting
        return (
            f'vllm:num_requests_running{{model_name="demo"}} {running}.0\n'
            f'vllm:num_requests_waiting{{model_name="demo"}} {waiting}.0\n'
        ).encode()


class Demo:
    """What one demo engine serves: its model, when it is ready, how it streams.

    A plain class, not a dataclass: ``dataclasses`` brings ``inspect`` (~15% of this
    engine's start), and the test suite starts thousands of demo engines."""

    def __init__(
        self,
        model: str,
        ready_at: float,  # monotonic: 503 "loading model" before it
        chunks: int,
        chunk_delay: float,
        metrics_file: str | None,  # GET /metrics answers this file's text as it is now
        slots: Slots | None = None,  # --slots: answers at once, the rest wait (vLLM's metrics)
    ) -> None:
        self.model = model
        self.ready_at = ready_at
        self.chunks = chunks
        self.chunk_delay = chunk_delay
        self.metrics_file = metrics_file
        self.slots = slots
        self.me = f"pid-{os.getpid()}"
        self.started = int(time.time())
        self.serial: Iterator[int] = itertools.count(1)  # answer ids


class DemoHandler(Handler):
    demo: Demo  # set on a subclass made by main(): what this engine is and serves
    # HTTP/1.1 keep-alive (httpserver.py): the gateway reuses connections.
    # An answer's headers and body go out as one write: wfile is buffered, flushed by
    # httpserver.py after each request and by a stream after each event. Two writes let a
    # SIGKILL land between them, and the gateway then holds headers without a body (a 502
    # it rightly does not retry: bytes had come). TCP_NODELAY for the streams' small
    # events, which would otherwise wait for the client's delayed ACK (~40 ms).
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        if time.monotonic() < self.demo.ready_at:
            self._send(503, {"status": "loading model"})
        elif self.path == "/health":
            self._send(200, {"status": "ok"})
        elif self.path == "/metrics" and self.demo.metrics_file:
            self._metrics(_read(self.demo.metrics_file))
        elif self.path == "/metrics" and self.demo.slots is not None:
            self._metrics(self.demo.slots.metrics())
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [self._model()]})
        elif self.path == f"/v1/models/{self.demo.model}":
            self._send(200, self._model())
        else:
            self._send(404, {"error": "not found"})

    def _metrics(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _model(self) -> Json:
        return {
            "id": self.demo.model,
            "object": "model",
            "created": self.demo.started,
            "owned_by": "demo",
        }

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            request = {}
        request = request if isinstance(request, dict) else {}
        if self.path.startswith("/v1/embeddings"):
            self._send(200, embeddings_answer(request, self.demo.model))
            return
        chat = self.path.startswith("/v1/chat/completions")
        prompt = tokens(prompt_text(request, chat))
        if request.get("stream"):
            options = request.get("stream_options")
            counted = isinstance(options, dict) and options.get("include_usage") is True
            with self.demo.slots.held() if self.demo.slots else contextlib.nullcontext():
                self._stream(chat, prompt, counted)
            return
        text = f"hello from {self.demo.model}"
        choice: Json = (
            {"index": 0, "message": {"role": "assistant", "content": text}}
            if chat
            else {"index": 0, "text": text}
        )
        choice["finish_reason"] = "stop"
        answer = self._answer(chat, [choice], self._id(chat))
        answer["usage"] = usage(prompt, tokens(text))
        self._send(200, answer)

    def _id(self, chat: bool) -> str:
        return f"{'chatcmpl' if chat else 'cmpl'}-{self.demo.me}-{next(self.demo.serial)}"

    def _answer(self, chat: bool, choices: list[Json], id_: str) -> Json:
        return {
            "id": id_,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.demo.model,
            "system_fingerprint": self.demo.me,
            "choices": choices,
        }

    def _stream(self, chat: bool, prompt: int, counted: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        # Chunked, as the real engines frame a stream: an engine killed mid-stream is then
        # an answer cut short, never one that looks complete (a close would end it).
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        id_ = self._id(chat)
        said = 0
        for i in range(self.demo.chunks):
            piece = f"chunk {i} "
            said += tokens(piece)
            delta: Json = {"content": piece}
            if chat and i == 0:
                delta = {"role": "assistant", **delta}
            last = "stop" if i == self.demo.chunks - 1 else None
            one = {"delta": delta} if chat else {"text": piece}
            self._event(self._chunk(chat, [{"index": 0, **one, "finish_reason": last}], id_))
            if self.demo.chunk_delay:
                time.sleep(self.demo.chunk_delay)
        if counted:  # OpenAI's last chunk: no choices, the whole answer's usage
            body = self._chunk(chat, [], id_)
            body["usage"] = usage(prompt, said)
            self._event(body)
        self._piece(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")  # the stream's last chunk
        self.wfile.flush()

    def _chunk(self, chat: bool, choices: list[Json], id_: str) -> Json:
        body = self._answer(chat, choices, id_)
        body["object"] = "chat.completion.chunk" if chat else "text_completion"
        return body

    def _event(self, body: Json) -> None:
        self._piece(f"data: {json.dumps(body)}\n\n".encode())

    def _piece(self, data: bytes) -> None:
        """One chunk of a streamed answer."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _send(self, code: int, body: Json) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *fmt_args: object) -> None:
        sys.stdout.write(f"{self.address_string()} {format % fmt_args}\n")
        sys.stdout.flush()


class DemoServer(Server):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-answer (a stream it stopped reading, a gateway whose
        # client went away) is the client's doing: one line, not a traceback in the
        # engine's log (which `reconcile logs` and a crash's log tail show people).
        gone = sys.exc_info()[1]
        if isinstance(gone, ConnectionError):
            peer = client_address[0] if isinstance(client_address, tuple) else client_address
            print(f"{peer} closed the connection mid-answer ({type(gone).__name__})", flush=True)
        else:
            super().handle_error(request, client_address)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--model", default="demo")
    parser.add_argument("--load-seconds", type=float, default=0.0)
    parser.add_argument("--chunks", type=int, default=3)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    # GET /metrics answers this file's text as it is now (Prometheus text, e.g. vLLM's or
    # llama.cpp's series, which a test rewrites to move the engine's load)
    parser.add_argument("--metrics-file", default=None)
    # streamed answers at once (an engine's batch); the rest wait, and /metrics says so
    parser.add_argument("--slots", type=int, default=None)
    args = parser.parse_args(argv)
    demo = Demo(
        model=args.model,
        ready_at=time.monotonic() + args.load_seconds,
        chunks=args.chunks,
        chunk_delay=args.chunk_delay,
        metrics_file=args.metrics_file,
        slots=Slots(args.slots) if args.slots else None,
    )
    server = DemoServer((args.host, args.port), type("Bound", (DemoHandler,), {"demo": demo}))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"demo engine {args.model} on {args.host}:{args.port} (pid {os.getpid()})", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


if __name__ == "__main__":
    sys.exit(main())
