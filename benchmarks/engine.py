"""The benchmarks' stand-in engine: note when it started, then answer HTTP 200 on a port.

    python -S -I benchmarks/engine.py PORT

Its first statement reads the clock, so ``T0`` is the exec time plus only the
interpreter's own start-up (the benchmarks measure and report that offset). With
``BENCH_EXEC_LOG`` set it appends ``pid t0 name`` to that file. Reconcile and
supervisord run exactly this command, so both pay the same start-up.
"""

import time

T0 = time.time()  # first statement: the exec timestamp the benchmarks read


import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

REPLY = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


def main() -> None:
    log = os.environ.get("BENCH_EXEC_LOG")
    name = os.environ.get("RECONCILE_NAME") or os.environ.get("BENCH_NAME", "")
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(fd, f"{os.getpid()} {T0:.6f} {name}\n".encode())
        os.close(fd)
    port = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ["PORT"])
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(128)
    while True:
        conn, _ = server.accept()
        try:
            conn.settimeout(1.0)
            conn.recv(4096)
            conn.sendall(REPLY)
        except OSError:
            pass
        finally:
            conn.close()


if __name__ == "__main__":
    main()
