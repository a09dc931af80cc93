"""Spec + placement -> what to exec: argv, environment, probe, deadline. Pure.

The recipe gives the engine's own argv and probe; the user's spec overrides the
probe and appends args; the engine environment of DESIGN.md is added last so no
spec can undo the device fence.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from controller.core.devices.inventory import Device, visibility_env
from controller.core.engines import (
    Launch,
    ReadinessChecks,
    RecipeError,
    RenderContext,
    image_program,
    pinned_image,
    readiness_deadline,
    recipe_for,
)
from controller.core.engines.owned import refuse_env
from controller.core.manifest.specs import DeploymentSpec, Entry, LivenessProbe, Readiness, expand
from controller.core.state import ProbeConfig

COMPLETION_TIMEOUT = 5.0  # seconds: a first completion may be slower than a GET


@dataclass(frozen=True, slots=True)
class Rendered:
    argv: tuple[str, ...]
    env: dict[str, str]
    probe: ProbeConfig
    liveness: ProbeConfig | None
    deadline_seconds: float
    stop_signal: int
    grace_seconds: float


def render(
    entry: Entry,
    *,
    devices: tuple[Device, ...],
    port: int,
    extra_ports: tuple[int, ...] = (),
    runtime_dir: str = "/tmp",
    python: str = sys.executable,
    model_path: str | None = None,
) -> Rendered:
    """``python``: what ``{python}`` names (export passes the container's ``python3``).
    ``model_path``: the pulled files of ``spec.source``; ``{model}`` and the recipe's model
    then name them instead of ``spec.model``."""
    spec = entry.deployment.spec
    model = model_path or spec.model
    values = {
        "port": str(port),
        "host": spec.host,
        "name": entry.name,
        "model": model or "",
        "devices": ",".join(d.id for d in devices),
        # The interpreter reconcile runs under (the default): a command of reconcile's own
        # package (the demo) then works from cron, systemd or another user's shell, where a
        # bare `python3` is not the venv's.
        "python": python,
    }
    ctx = RenderContext(
        name=entry.name,
        model=model,
        executable=spec.executable or _program_in_image(spec),
        host=spec.host,
        port=port,
        extra_ports=extra_ports,
        devices=devices,
        args=tuple(expand(a, values) for a in spec.args),
        command=tuple(expand(a, values) for a in spec.command or ()),
        runtime_dir=runtime_dir,
        memory=spec.devices.memory,
    )
    launch = recipe_for(spec.engine).launch(ctx)
    refuse_env(spec.engine, spec.env, launch.env)
    # As Kubernetes: spec.env wins over envFrom's secrets, the device fence over both.
    env = {**launch.env, **entry.secret_env, **spec.env, **visibility_env(devices)}
    env["PORT"] = str(port)
    env["RECONCILE_NAME"] = entry.name
    return Rendered(
        argv=launch.argv,
        env=env,
        probe=_probe(entry, launch),
        liveness=liveness_of(entry, launch),
        deadline_seconds=deadline_of(spec),
        stop_signal=launch.stop_signal,
        grace_seconds=spec.stop_grace_period_seconds,
    )


def container_image(spec: DeploymentSpec) -> str:
    """The image a container engine runs: ``spec.container.image``, else the recipe's
    pinned one (llama.cpp's CUDA build for an instance that holds a GPU). Never
    ``spec.image``: that one is `reconcile export`'s alone and outside the spec hash, so
    running it would let an edit change what runs with no restart (DESIGN.md)."""
    if spec.container is not None and spec.container.image is not None:
        return spec.container.image
    return pinned_image(spec.engine, gpu=holds_gpu(spec))


def holds_gpu(spec: DeploymentSpec) -> bool:
    """The spec asks for GPUs (``kind: any`` counts: it is placed on them where there are)."""
    return spec.devices.count > 0 and spec.devices.kind in ("nvidia", "amd", "any")


def _program_in_image(spec: DeploymentSpec) -> str | None:
    """In a container, the recipe's program is the one inside its pinned image."""
    if spec.container is None or spec.container.image is not None:
        return None
    return image_program(spec.engine)


def _probe(entry: Entry, launch: Launch) -> ProbeConfig:
    readiness = entry.deployment.spec.readiness
    period = readiness.period_seconds if readiness else 2.0
    if readiness is not None:
        named = _named(readiness, launch, period)
        if named is not None:
            return named
    return _checks(launch.readiness, period)


def liveness_of(entry: Entry, launch: Launch) -> ProbeConfig | None:
    """spec.livenessProbe (its kind, else the recipe's health check, else the readiness
    probe's httpGet), else the same default (period 10 s, timeout 5 s, 3 failures); None
    where there is none."""
    asked = entry.deployment.spec.liveness_probe
    spec = LivenessProbe() if asked is None else asked
    if not spec.enabled:
        return None
    check = _named(spec, launch, spec.period_seconds)
    if check is None and launch.liveness is not None:
        check = _checks(launch.liveness, spec.period_seconds)
    readiness = entry.deployment.spec.readiness
    if check is None and readiness is not None and readiness.http_get is not None:
        # engine: command whose readiness is a GET: the same GET keeps checking it once
        # Ready. Without it a SIGSTOP'd replica kept its place behind the gateway for good.
        check = ProbeConfig(
            http=((readiness.http_get.path, None),), period_seconds=spec.period_seconds
        )
    if check is None and asked is None:
        return None  # engine: command, no GET readiness, no livenessProbe: nothing checks
    if check is None:
        raise RecipeError(
            f"spec.livenessProbe of {entry.name!r} names no check and engine "
            f"{entry.deployment.spec.engine!r} has no health path: add httpGet, tcpSocket "
            "or completion"
        )
    return replace(
        check, timeout_seconds=spec.timeout_seconds, failure_threshold=spec.failure_threshold
    )


def _named(probe: Readiness | LivenessProbe, launch: Launch, period: float) -> ProbeConfig | None:
    """The check a probe of the spec names itself (None: it names none)."""
    if probe.http_get is not None:
        return ProbeConfig(http=((probe.http_get.path, None),), period_seconds=period)
    if probe.tcp_socket is not None:
        return ProbeConfig(tcp=True, period_seconds=period)
    if probe.completion is not None:
        target = launch.completion
        return ProbeConfig(
            completion=target.path,
            model=target.model,
            period_seconds=period,
            timeout_seconds=COMPLETION_TIMEOUT,  # a readiness answer (liveness sets its own)
        )
    return None


def _checks(checks: ReadinessChecks, period: float) -> ProbeConfig:
    http = tuple((c.path, c.contains) for c in checks.http)
    return ProbeConfig(http=http, tcp=checks.tcp, period_seconds=period)


def deadline_of(spec: DeploymentSpec) -> float:
    """The readiness deadline an engine of ``spec`` gets (no placement needed: a
    Pending or Idle record states it too)."""
    readiness = spec.readiness
    return readiness_deadline(spec.engine, readiness.deadline_seconds if readiness else None)
