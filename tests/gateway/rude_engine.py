"""An engine that drops its connections, each way an engine can (for the gateway's tests).

    python rude_engine.py --port N [--always MODE] [--fail-while FILE] [--drop-reused]

``GET /health`` answers 200. A POST does what its path's last segment says (or
``--always``): ``close`` closes before answering, ``reset`` resets (RST), ``half`` sends
headers and part of a sized body, ``sse`` sends one chunked server-sent event and
closes mid-stream; anything else (``--always ok``) is a whole JSON answer naming this
pid. While ``--fail-while FILE`` exists, every POST is a 500 (a sick engine that
still answers ``/health``: passive health's case). With ``--drop-reused`` a connection's
first POST is answered and the connection kept; a second POST on it is read and the
connection closed unanswered (llama.cpp's server closing a connection after a streamed
answer just as the gateway reuses it). Each request is one stdout line
(``POST /v1/x``): a test counts what reached it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import threading
from pathlib import Path

MODES = ("close", "reset", "half", "sse")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--always", choices=(*MODES, "ok"))
    parser.add_argument("--fail-while", type=Path)
    parser.add_argument("--drop-reused", action="store_true")
    args = parser.parse_args()
    server = socket.create_server(("127.0.0.1", args.port), reuse_port=False)
    while True:
        conn, _ = server.accept()
        if args.drop_reused:
            threading.Thread(target=serve_then_drop, args=(conn,), daemon=True).start()
            continue
        work = (conn, args.always, args.fail_while)
        threading.Thread(target=serve, args=work, daemon=True).start()


def serve_then_drop(conn: socket.socket) -> None:
    """One POST answered on a kept-alive connection; the next one on it dropped."""
    with conn:
        for turn in range(2):
            line = read_request(conn)
            if line is None:
                return
            print(line, flush=True)
            if line.startswith("GET /health"):
                answer(conn, b'{"status": "ok"}')
                return
            if turn == 0:
                body = json.dumps({"object": "ok", "system_fingerprint": f"pid-{os.getpid()}"})
                answer(conn, body, keep=True)


def read_request(conn: socket.socket) -> str | None:
    """A whole request (head and sized body) read; its request line, None at EOF."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        head += chunk
    head, _, body = head.partition(b"\r\n\r\n")
    length = next(
        (
            int(v)
            for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
            if k.strip().lower() == b"content-length"
        ),
        0,
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    method, path = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")[:2]
    return f"{method} {path}"


def serve(conn: socket.socket, always: str | None, fail_while: Path | None = None) -> None:
    with conn:
        line = read_request(conn)  # whole: a close with unread bytes would be a reset
        if line is None:
            return
        method, path = line.split(" ")
        print(f"{method} {path}", flush=True)
        if method == "GET" and path == "/health":
            answer(conn, b'{"status": "ok"}')
            return
        if fail_while is not None and fail_while.exists():
            answer(conn, b'{"error": "sick"}', status="500 Internal Server Error")
            return
        mode = always or path.rstrip("/").rsplit("/", 1)[-1]
        if mode == "reset":  # SO_LINGER 0: close() sends RST, not FIN
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif mode == "half":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b'{"partial": ')
        elif mode == "sse":
            event = b'data: {"choices": [{"delta": {"content": "one"}}]}\n\n'
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(event), event)
            )
        elif mode != "close":
            answer(conn, json.dumps({"object": "ok", "system_fingerprint": f"pid-{os.getpid()}"}))


def answer(
    conn: socket.socket, body: bytes | str, status: str = "200 OK", *, keep: bool = False
) -> None:
    data = body.encode() if isinstance(body, str) else body
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    close = b"" if keep else b"Connection: close\r\n"
    conn.sendall(head.encode() + close + b"\r\n" + data)


if __name__ == "__main__":
    main()
