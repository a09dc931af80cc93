"""Spec + placement -> what to exec: argv, environment, probe, deadline. Pure.

The recipe gives the engine's own argv and probe; the user's spec overrides the
probe and appends args; the engine environment of DESIGN.md is added last so no
spec can undo the device fence.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from controller.core.engines import Launch, RenderContext, readiness_deadline, recipe_for
from controller.core.inventory import Device, visibility_env
from controller.core.specs import DeploymentSpec, Entry, expand
from controller.core.state import ProbeConfig


@dataclass(frozen=True, slots=True)
class Rendered:
    argv: tuple[str, ...]
    env: dict[str, str]
    probe: ProbeConfig
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
        executable=spec.executable,
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
    env = {**launch.env, **spec.env, **visibility_env(devices)}
    env["PORT"] = str(port)
    env["RECONCILE_NAME"] = entry.name
    return Rendered(
        argv=launch.argv,
        env=env,
        probe=_probe(entry, launch),
        deadline_seconds=deadline_of(spec),
        stop_signal=launch.stop_signal,
        grace_seconds=spec.stop_grace_period_seconds,
    )


def _probe(entry: Entry, launch: Launch) -> ProbeConfig:
    readiness = entry.deployment.spec.readiness
    period = readiness.period_seconds if readiness else 2.0
    if readiness is not None and readiness.http_get is not None:
        return ProbeConfig(http=((readiness.http_get.path, None),), period_seconds=period)
    if readiness is not None and readiness.tcp_socket is not None:
        return ProbeConfig(tcp=True, period_seconds=period)
    checks = tuple((c.path, c.contains) for c in launch.readiness.http)
    return ProbeConfig(http=checks, tcp=launch.readiness.tcp, period_seconds=period)


def deadline_of(spec: DeploymentSpec) -> float:
    """The readiness deadline an engine of ``spec`` gets (no placement needed: a
    Pending or Idle record states it too)."""
    readiness = spec.readiness
    return readiness_deadline(spec.engine, readiness.deadline_seconds if readiness else None)
