"""The seam between a pass and where engines run: one ``Backend`` protocol.

The reconciler, the executor and the observer see only this protocol, never a
concrete backend, and are handed one from outside (the CLI or the daemon picks
it). A backend runs one engine instance per record and answers for it by
``ProcessRef`` (identity, invariant 6) and by the instance nonce (the marker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from controller.core.state import MarkedProcess, ProcessRef, Record


@dataclass(frozen=True)
class ExitStatus:
    """How an engine ended, when the backend saw it end (else unknown: None)."""

    code: int | None
    signal: int | None


class Backend(Protocol):
    name: str  # "local" or "ray": written into records and shown by status

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        name: str,
        nonce: str,
        log_path: Path,
    ) -> ProcessRef:
        """Start one engine instance carrying the marker ``<node>/<name>/<nonce>``."""
        ...

    def alive(self, ref: ProcessRef | None) -> bool:
        """Invariant 6: True only for the very process the ref names."""
        ...

    def exit_of(self, ref: ProcessRef) -> ExitStatus | None: ...

    def scan(self) -> list[MarkedProcess]:
        """Every live process carrying one of our markers (adoption, orphans)."""
        ...

    def teardown(self, rec: Record) -> None:
        """Stop the record's instance entirely (invariant 10) and wait for its devices."""
        ...

    def sweep(self, nonce: str | None, ref: ProcessRef | None = None) -> int:
        """Kill whatever still carries the nonce's marker; how many were killed."""
        ...

    def kill(self, ref: ProcessRef) -> None: ...

    def listening_ports(self) -> frozenset[int]:
        """Ports something listens on where engines run (placement avoids them)."""
        ...

    def port_bindable(self, port: int) -> bool:
        """A bind probe: False when a socket (maybe not yet listening) holds the port."""
        ...

    def log_tail(self, name: str, count: int) -> list[str]:
        """The last ``count`` lines the deployment's current run wrote."""
        ...
