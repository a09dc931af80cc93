"""The head's GCS address: parsed, checked by a plain TCP connect, and its process asked
whether it runs (``answers``).

No ``ray`` here: the daemon checks the head before it asks its driver process anything
(``driver.py``), and never imports Ray itself.
"""

from __future__ import annotations

import socket

from controller.errors import BackendUnavailable

CONNECT_TIMEOUT = 5.0  # seconds for the TCP check of the head's address, and its answer
# An HTTP/2 client's preface and an empty SETTINGS frame. The GCS, a gRPC server, answers
# it at once from its I/O threads (its own SETTINGS; a TLS one an alert, or a close),
# however busy its handlers are; a GCS whose process is stopped, or whose host is frozen,
# takes the connection in its kernel and says nothing, and a Ray call to it hangs.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def reachable(address: str) -> None:
    """A plain TCP connect first: ray.init retries an unreachable GCS for a minute."""
    if address == "auto":
        return  # the local session file names the cluster
    host, port = host_port(address)
    try:
        with socket.create_connection((host, port), CONNECT_TIMEOUT):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise BackendUnavailable(
            f"cannot reach the Ray cluster at {address}: {reason}. Is `ray start --head`"
            " running there, and is --ray-address (RECONCILE_RAY_ADDRESS) its GCS host:port?"
            " Nothing was changed"
        ) from exc


def answers(address: str) -> str | None:
    """None when the head's GCS process answers a connection now (a reply to ``PREFACE``
    within CONNECT_TIMEOUT), else why not, in a few words: a Ray call to a head that is
    gone hangs until its caller's deadline, which is sized for a slow answer, not none."""
    if address == "auto":
        return None  # the local session file names the cluster: no address to ask
    host, port = host_port(address)
    try:
        sock = socket.create_connection((host, port), CONNECT_TIMEOUT)
    except OSError as exc:
        return f"its GCS port takes no connection ({exc.strerror or exc})"
    with sock:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.sendall(PREFACE)
            sock.recv(1)  # its SETTINGS; or b"" (closed): an answer too
        except TimeoutError:
            return (
                f"its GCS took a connection and said nothing in {CONNECT_TIMEOUT:g}s (its"
                " process stopped, or its host frozen)"
            )
        except OSError:
            return None  # reset: the process (or its kernel, at its end) answered
    return None


def host_port(address: str) -> tuple[str, int]:
    """The GCS's (host, port) in ``address``; else why it is not one, naming the fix."""
    fix = (
        "give the head's GCS address, HOST:PORT (`ray start --head --port 6379` prints it),"
        " as --ray-address or RECONCILE_RAY_ADDRESS. Nothing was changed"
    )
    if address.startswith("ray://"):
        raise BackendUnavailable(f"--ray-address {address}: Ray Client is not supported; {fix}")
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or not 0 < int(port) < 65536:
        raise BackendUnavailable(f"--ray-address {address}: no port in it; {fix}")
    return host.strip("[]") or "127.0.0.1", int(port)  # [::1]:6379 too
