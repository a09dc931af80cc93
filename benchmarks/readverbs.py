"""8. Read verbs: ``reconcile status`` next to ``supervisorctl status``, ``--once`` on
Ready deployments next to importing what a pass needs.

- ``reconcile status`` with 10 Ready deployments vs ``supervisorctl status`` with 10
  running programs (its daemon up; the client reads them over its socket);
- a no-op ``reconcile --once`` on 20 Ready deployments vs
  ``python -c 'import pydantic, yaml'`` (the manifests' parser and validator alone).

Trials interleave ours and theirs, so the machine's noise hits both alike.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import supervisor as sv_mod
from benchmarks.common import (
    HTTP_READY,
    PYTHON,
    Row,
    answers,
    engine_argv,
    free_port_block,
    manifest,
    reconcile_argv,
    run,
    wait_for,
    workspace,
)


def _ready(ws_manifests: Path, count: int, prefix: str) -> None:
    base = free_port_block(count + 10, 26000 if prefix == "s" else 27000)
    for i in range(count):
        name = f"{prefix}{i:02d}"
        text = manifest(name, engine_argv(), base_port=base, readiness=HTTP_READY)
        (ws_manifests / f"{name}.yaml").write_text(text)


def bench(trials: int, status_n: int = 10, once_n: int = 20) -> list[Row]:
    """``status_n`` Ready deployments (and programs) for the status row, ``once_n`` for
    the ``--once`` row (``--quick``: a few, the same code paths)."""
    return [_status(trials, status_n), _once(trials, once_n)]


def _status(trials: int, count: int) -> Row:
    ours: list[float] = []
    theirs: list[float] = []
    have_sv = sv_mod.available()
    with workspace("status") as ws:
        _ready(ws.manifests, count, "s")
        env = ws.env()
        run([*reconcile_argv(), "--once", "--wait", "--timeout", "60s", *ws.common()], env=env)
        status = [*reconcile_argv(), "status", *ws.common()]
        run(status, env=env)  # warm: the page cache, the bytecode
        if have_sv:
            with sv_mod.supervisor("status") as sv:
                base = free_port_block(count + 10, 28000)
                for i in range(count):
                    sv.add(f"p{i:02d}", base + i)
                sv.start()
                sv.wait_up()
                wait_for(lambda: all(answers(base + i) for i in range(count)), 60, "programs")
                ctl = [str(Path(PYTHON).with_name("supervisorctl")), "-c", str(sv.conf), "status"]
                run(ctl, env=env)
                for _ in range(trials):
                    ours.append(run(status, env=env) * 1000)
                    theirs.append(run(ctl, env=env) * 1000)
        else:
            ours = [run(status, env=env) * 1000 for _ in range(trials)]
        run([*reconcile_argv(), "down", *ws.common()], env=env, timeout=120)
    row = Row(
        section="8. read verbs",
        metric=f"`reconcile status`, {count} Ready",
        unit="ms",
        ours=ours,
        theirs=theirs,
        alt=f"`supervisorctl status`, {count} programs"
        if have_sv
        else "supervisorctl (not installed)",
        goal="≤ 1.0x",
    )
    row.met = row.ratio is not None and row.ratio <= 1.0
    return row


def _once(trials: int, count: int) -> Row:
    ours: list[float] = []
    theirs: list[float] = []
    with workspace("once20") as ws:
        _ready(ws.manifests, count, "o")
        env = ws.env()
        once = [*reconcile_argv(), "--once", *ws.common()]
        run([*reconcile_argv(), "--once", "--wait", "--timeout", "60s", *ws.common()], env=env)
        imports = [PYTHON, "-c", "import pydantic, yaml"]
        run(imports, env=env)
        for _ in range(trials):
            theirs.append(run(imports, env=env) * 1000)
            ours.append(run(once, env=env) * 1000)
        run([*reconcile_argv(), "down", *ws.common()], env=env, timeout=120)
    row = Row(
        section="8. read verbs",
        metric=f"no-op `reconcile --once`, {count} Ready",
        unit="ms",
        ours=ours,
        theirs=theirs,
        alt="`python -c 'import pydantic, yaml'`",
        # No goal since issue 20: a pass imports pydantic, as DESIGN.md asks; shown for scale.
    )
    return row
