"""The gateway's settings, checked before the daemon starts (each refusal is exit 64)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from controller.core.listen import LOOPBACK, split_listen
from controller.errors import ConfigError

DEFAULT_HOST = LOOPBACK
DEFAULT_MAX_BODY = 32 * 1024 * 1024  # long prompts and base64 images fit; a flood does not
DEFAULT_MAX_INFLIGHT = 128  # per deployment: engines batch; a bigger box raises it
DEFAULT_MAX_QUEUE = 256
QUEUE_WAIT = 30.0  # seconds a queued request waits for a slot before its 429


class ListenRefused(ConfigError):
    """A non-loopback bind without keys, or a bad ``--listen``: exit 64."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    host: str
    port: int
    state_dir: Path
    api_keys: Path | None = None
    insecure: bool = False
    max_body: int = DEFAULT_MAX_BODY
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    max_queue: int = DEFAULT_MAX_QUEUE
    queue_wait: float = QUEUE_WAIT

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


def parse_listen(text: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[V6]:PORT``; the host defaults to loopback."""
    found = split_listen(text)
    if found is None:
        raise ListenRefused(f"--listen {text!r}: expected [HOST:]PORT, e.g. 8080 or 0.0.0.0:8080")
    return found


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def check_exposure(settings: Settings) -> str | None:
    """Refuse a non-loopback bind without keys; the warning to log when it is insecure."""
    if settings.loopback or settings.api_keys is not None:
        return None
    if not settings.insecure:
        raise ListenRefused(
            f"--listen {settings.host}:{settings.port} is reachable from other machines, and "
            "without --api-keys anyone who reaches it can run every model. Give --api-keys FILE "
            "(one key per line, chmod 600), or --insecure-listen to accept the risk"
        )
    return (
        f"the gateway on {settings.host}:{settings.port} has no API keys (--insecure-listen): "
        "anyone who reaches it can run every model"
    )
