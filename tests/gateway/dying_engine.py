"""An engine that dies as a SIGKILLed one is seen to from the gateway, every time (for
the gateway's tests; a real SIGKILL races the gateway's request):

    python dying_engine.py PORT LIVES

``GET /health`` answers 200; a POST, a JSON answer naming this pid, on a kept-alive
connection. In its first life (``LIVES`` does not exist yet; it is written at once),
the second POST on a connection finds the engine dying: that connection reset
unanswered, the next connection to ask something (the gateway's retry, which a dying
process's backlog took) reset too once the port is closed, then the engine SIGKILLs
itself. Its next lives (the daemon's restarts) answer every request.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import threading
from pathlib import Path

HEAD_END = b"\r\n\r\n"


def main() -> None:
    port, lives = int(sys.argv[1]), Path(sys.argv[2])
    dies = not lives.exists()
    lives.touch()
    listener = socket.create_server(("127.0.0.1", port))
    dying = threading.Event()
    while True:
        conn, _ = listener.accept()
        if not dying.is_set():
            threading.Thread(target=serve, args=(conn, dies, dying), daemon=True).start()
            continue
        method = read_request(conn)
        if method == "POST":  # the retry: the port closes, its connection resets
            listener.close()
            reset(conn)
            os.kill(os.getpid(), signal.SIGKILL)
        if method is not None:
            answer(conn, method)  # a probe of the daemon's
        conn.close()


def serve(conn: socket.socket, dies: bool, dying: threading.Event) -> None:
    posts = 0
    with conn:
        while (method := read_request(conn)) is not None:
            posts += method == "POST"
            if dies and posts == 2:
                dying.set()
                reset(conn)
                return
            answer(conn, method)


def read_request(conn: socket.socket) -> str | None:
    """The method of the next request on ``conn`` (its body read); None at its end."""
    data = b""
    while HEAD_END not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(HEAD_END)
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return lines[0].split(" ", 1)[0]


def answer(conn: socket.socket, method: str) -> None:
    said: dict[str, object] = {}
    if method == "POST":
        said = {
            "object": "chat.completion",
            "system_fingerprint": f"pid-{os.getpid()}",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        }
    body = json.dumps(said).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    conn.sendall(head.encode() + b"\r\n" + body)


def reset(conn: socket.socket) -> None:
    """Close with an RST, as the kernel ends a killed process's connections."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


if __name__ == "__main__":
    main()
