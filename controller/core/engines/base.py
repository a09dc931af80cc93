"""The recipe interface: how one engine is launched, probed and stopped.

A recipe is pure: it turns a :class:`RenderContext` into a :class:`Launch`
(argv, extra environment, readiness checks, stop signal). It never looks at the
machine; the runtime execs what it returns. Its readiness deadline is a fact of the
recipe itself, not of one launch: a record that was never rendered (Pending, Idle)
states the same deadline as the engine will get.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controller.core.devices.inventory import GPU_KINDS, Device
from controller.errors import RecipeError as RecipeError  # re-exported: the recipes raise it


@dataclass(frozen=True, slots=True)
class HttpCheck:
    """GET ``path``; ready when the status is 200-399 (a redirect is not followed) and,
    if set, the body contains ``contains``."""

    path: str
    contains: str | None = None


@dataclass(frozen=True, slots=True)
class ReadinessChecks:
    """All ``http`` checks must pass; else a TCP connect if ``tcp``; else ready once running."""

    http: tuple[HttpCheck, ...] = ()
    tcp: bool = False

    @property
    def kind(self) -> str:
        return "http" if self.http else "tcp" if self.tcp else "exec"


@dataclass(frozen=True, kw_only=True, slots=True)
class RenderContext:
    name: str
    model: str | None
    executable: str | None
    host: str
    port: int
    # Per-instance internal ports (TGI's master port...), as many as the recipe's extra_ports.
    extra_ports: tuple[int, ...] = ()
    devices: tuple[Device, ...] = ()
    # The user's spec.args and spec.command, placeholders already expanded.
    args: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    # spec.devices.memory: bytes on each device (engines that pre-allocate get it as a share).
    memory: int | None = None
    # A private scratch folder for this instance (unix sockets, caches) inside the state dir.
    runtime_dir: str = "/tmp"

    @property
    def gpus(self) -> int:
        """The GPUs among the devices: what vLLM, SGLang and TGI split the model over (a
        cpu device is no GPU to shard over, and the engine never sees it)."""
        return sum(1 for d in self.devices if d.kind in GPU_KINDS)


# The health checks a recipe's liveness probe uses where the spec names none.
HEALTH = ReadinessChecks(http=(HttpCheck("/health"),))
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@dataclass(frozen=True, slots=True)
class CompletionTarget:
    """Where a ``completion: {}`` probe POSTs and the model id it asks for."""

    path: str = CHAT
    model: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Launch:
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    readiness: ReadinessChecks = ReadinessChecks()
    # The engine's own health check for a default livenessProbe (None: it has none).
    liveness: ReadinessChecks | None = None
    completion: CompletionTarget = CompletionTarget()
    stop_signal: int = signal.SIGTERM


class Recipe(Protocol):
    """One engine. ``extra_ports`` internal ports are reserved beside the main one;
    ``deadline_seconds``: how long its engine may take to get Ready unless the spec says;
    ``caches_prefixes``: it keeps the KV cache of served prompts for the next request that
    begins the same way (the gateway's ``affinity: prefix`` is then its default)."""

    engine: str
    extra_ports: int
    deadline_seconds: float
    caches_prefixes: bool

    def launch(self, ctx: RenderContext) -> Launch: ...
