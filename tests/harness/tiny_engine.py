"""The smallest engine the harness can run by the hundred: listen on $PORT, exit on TERM.

Run as ``python -S -I tiny_engine.py``: no site import, so it starts in milliseconds.
"""

import os
import signal
import socket

signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind((os.environ.get("HOST", "127.0.0.1"), int(os.environ["PORT"])))
sock.listen(16)
while True:
    conn, _ = sock.accept()
    conn.close()
