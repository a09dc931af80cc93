"""The head's GCS address: parsed, and checked by a plain TCP connect.

No ``ray`` here: the daemon checks the head before it asks its driver process anything
(``driver.py``), and never imports Ray itself.
"""

from __future__ import annotations

import socket

from controller.errors import BackendUnavailable

CONNECT_TIMEOUT = 5.0  # seconds for the TCP check of the head's address


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
