"""What a reload refused: ``<state>/refused.json``, until a later reload takes it.

(And a gateway the daemon could not start again after a crash: the same silence, the
same place to say it.)

A SIGHUP whose node.yaml, key file or TLS pair is refused keeps the settings in force
(nginx keeps its old configuration the same way), and the log says so; `status` and
`reconcile gateway status` say it too, so nobody takes an edit for applied (Kubernetes
shows such a state as a condition, systemd as "unit file changed on disk"). One entry
per subject: what was refused, why (the file, line and field), who refused it, since
when (the first refusal of a run of them) and when last. The reload that takes the
subject clears it; a new gateway clears what it read at its start (its key file and
TLS pair were taken), and a gateway that stops clears what only it said.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller.errors import ReconcileError
from controller.logsetup import get_logger
from controller.store.documents import Document
from controller.store.statedir import StateDir

log = get_logger("reconcile")

NODE_CONFIG = "node config"  # the daemon's configuration (node.yaml, flags) as re-read
GATEWAY_SETTINGS = "gateway settings"  # node.yaml's tlsCert/tlsKey, logMax*: a new gateway
API_KEYS = "API keys"  # the gateway's key file
TLS_PAIR = "TLS pair"  # the gateway's certificate and key
GATEWAY_START = "gateway start"  # a crashed or stopped gateway the daemon cannot start again
# What each refusal leaves in force, for the people who read it.
KEPT = {
    NODE_CONFIG: "the daemon runs on with the configuration it had",
    GATEWAY_SETTINGS: "the gateway serves on with its own settings",
    API_KEYS: "the gateway keeps the keys loaded before",
    TLS_PAIR: "the gateway keeps the certificate in force",
    GATEWAY_START: "no gateway serves; the daemon tries again, backing off up to 30 s",
}


@dataclass(frozen=True, slots=True)
class Refusal:
    subject: str  # one of KEPT's keys
    why: str  # the error: the file, line and field (never a key: errors never hold one)
    by: str  # who refused it: "daemon pid 12", "gateway pid 34"
    since: datetime  # the first refusal of this subject in a row
    at: datetime  # the latest
    gateway: str | None = None  # the refusing gateway's nonce (cleared when it stops)

    def said(self) -> str:
        """One line for people: what, why, what stays, the next move."""
        kept = KEPT.get(self.subject, "the settings in force stay")
        what = "failed" if self.subject == GATEWAY_START else "reload refused"
        return (
            f"{what} ({self.subject}, by {self.by}): {self.why}; {kept}: fix it "
            "and SIGHUP the daemon again"
        )


def _document(state_dir: Path) -> Document[list[Refusal]]:
    state = StateDir(state_dir)
    return Document(state, state.refused, _decode, lambda found: [_encode(r) for r in found])


def refuse(state_dir: Path, subject: str, why: str, by: str, *, gateway: str | None = None) -> None:
    """Note that a reload refused ``subject``; a refusal already noted keeps its ``since``."""
    now = datetime.now(UTC)

    def change(found: list[Refusal]) -> list[Refusal]:
        before = next((r for r in found if r.subject == subject), None)
        since = before.since if before is not None else now
        fresh = Refusal(subject, why, by, since, now, gateway)
        return [*(r for r in found if r.subject != subject), fresh]

    _update(state_dir, change)


def clear(state_dir: Path, *subjects: str, gateway: str | None = None) -> None:
    """A reload took ``subjects``; ``gateway``: only what that gateway said (it stops)."""

    def change(found: list[Refusal]) -> list[Refusal]:
        mine = [r for r in found if r.subject in subjects]
        if gateway is not None:
            mine = [r for r in mine if r.gateway == gateway]
        return [r for r in found if r not in mine]

    if StateDir(state_dir).refused.exists():  # the usual case costs one stat, no lock
        _update(state_dir, change)


def peek(state_dir: Path) -> list[Refusal]:
    """The refusals in force, oldest first, for a reader that changes nothing."""
    return sorted(_document(state_dir).peek() or [], key=lambda r: r.since)


def _update(state_dir: Path, change: Callable[[list[Refusal]], list[Refusal]]) -> None:
    """A note is worth less than the reload it tells of: a write that fails is logged."""
    try:
        _document(state_dir).update(change, [], "the reload refusals")
    except (OSError, ReconcileError) as exc:
        log.warning(
            "reload refusal not noted", file=str(StateDir(state_dir).refused), error=str(exc)
        )


def _encode(found: Refusal) -> dict[str, Any]:
    return {
        "subject": found.subject,
        "why": found.why,
        "by": found.by,
        "since": found.since.isoformat(),
        "at": found.at.isoformat(),
        "gateway": found.gateway,
    }


def _decode(data: Any) -> list[Refusal]:
    if not isinstance(data, list):
        raise TypeError(f"a list of refusals, not {type(data).__name__}")
    return [_refusal(item) for item in data]


def _refusal(item: Any) -> Refusal:
    gateway = item.get("gateway")
    return Refusal(
        subject=str(item["subject"]),
        why=str(item["why"]),
        by=str(item["by"]),
        since=datetime.fromisoformat(item["since"]),
        at=datetime.fromisoformat(item["at"]),
        gateway=str(gateway) if gateway else None,
    )
