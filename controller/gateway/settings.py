"""The gateway's settings, checked before the daemon starts (each refusal is exit 64)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from controller.core.manifest.listen import LOOPBACK, split_listen
from controller.core.manifest.listen import is_loopback as is_loopback  # re-exported
from controller.errors import ConfigError
from controller.store.instances import logfiles
from controller.store.statedir import StateDir

DEFAULT_HOST = LOOPBACK
DEFAULT_MAX_BODY = 32 * 1024 * 1024  # long prompts and base64 images fit; a flood does not
# Bytes of request bodies held at once, all requests together: 4 bodies of --max-body, or
# a thousand long prompts. A body is in memory up to ~6 times over while it is read,
# parsed and sent on, so this bounds the gateway's RSS to well under a GB.
DEFAULT_MAX_BODY_TOTAL = 128 * 1024 * 1024
DEFAULT_MAX_INFLIGHT = 128  # per deployment: engines batch; a bigger box raises it
DEFAULT_MAX_QUEUE = 256
QUEUE_WAIT = 30.0  # seconds a queued request waits for a slot before its 429
# Seconds a stopping gateway lets its requests (streams included) finish; a handed-over
# one finishes them however long they take, unless a SIGTERM bounds it to this much.
DRAIN_GRACE = 120.0
# Seconds between the SSE comments of a streaming request held while its engine starts
# (waiting.py; DESIGN "Routing that helps the engine"). WAITING_ENV shortens it (tests, or
# a proxy in front with an idle timeout under 5 s).
WAITING_EVERY = 5.0
WAITING_ENV = "RECONCILE_GATEWAY_WAITING_COMMENT"


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
    max_body_total: int = DEFAULT_MAX_BODY_TOTAL  # never below max_body (app.py)
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    max_queue: int = DEFAULT_MAX_QUEUE
    queue_wait: float = QUEUE_WAIT
    drain_grace: float = DRAIN_GRACE
    # The records it routes (the daemon's owner and node: a pass's ``ours()``).
    owner: str = ""
    node: str = ""
    verbosity: int = 0  # the daemon's -v, for the gateway process's own log lines
    devices: str | None = None  # the daemon's static inventory (--devices): the web page's
    tls_cert: Path | None = None  # HTTPS only when set, with tls_key (tls.py)
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # mutual TLS: clients show a certificate it signed
    # The request log's rotation (requestlog.py): node.yaml's logMaxBytes / logMaxFiles.
    log_max_bytes: int = logfiles.DEFAULT_MAX_BYTES
    log_keep: int = logfiles.DEFAULT_KEEP
    # Where the settings above that node.yaml gives came from, so `reconcile gateway
    # restart` reads them again as the daemon would (gatewayflags.reread): the daemon's
    # --node-config (None: the state dir's node.yaml), and whether the TLS pair is the
    # file's (no flag or environment named one; False keeps the pair as it is).
    node_config: Path | None = None
    node_tls: bool = False
    waiting_comment: float = WAITING_EVERY  # seconds between a held stream's comments

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def node_file(self) -> Path:
        """The node.yaml its node settings come from (as the daemon reads it)."""
        return self.node_config or StateDir(self.state_dir).node_config

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


def waiting_every_from_env(environ: Mapping[str, str] | None = None) -> float:
    """``$RECONCILE_GATEWAY_WAITING_COMMENT`` when a number of seconds in (0, 3600), else 5."""
    text = (os.environ if environ is None else environ).get(WAITING_ENV, "")
    try:
        value = float(text)
    except ValueError:
        return WAITING_EVERY
    return value if 0 < value < 3600 else WAITING_EVERY


def parse_listen(text: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[V6]:PORT``; the host defaults to loopback."""
    found = split_listen(text)
    if found is None:
        raise ListenRefused(f"--listen {text!r}: expected [HOST:]PORT, e.g. 8080 or 0.0.0.0:8080")
    return found


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


# How node.yaml names the settings it gives (what a person changed there): a message
# about them says these, not the fields' names here.
NODE_NAMES = {
    "tls_cert": "tlsCert",
    "tls_key": "tlsKey",
    "log_max_bytes": "logMaxBytes",
    "log_keep": "logMaxFiles",
}


def said(name: str) -> str:
    """A setting's name as its user wrote it: node.yaml's for those it gives."""
    return NODE_NAMES.get(name, name)


PATHS = (
    "api_keys",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "node_config",
)  # optional paths, as strings in JSON


def settings_to_json(settings: Settings) -> dict[str, Any]:
    data = asdict(settings)
    data["state_dir"] = str(settings.state_dir)
    for name in PATHS:
        value = getattr(settings, name)
        data[name] = str(value) if value else None
    return data


def settings_from_json(data: dict[str, Any]) -> Settings:
    fields = dict(data)
    fields["state_dir"] = Path(fields["state_dir"])
    for name in PATHS:
        value = fields.get(name)
        fields[name] = Path(value) if value else None
    return Settings(**fields)
