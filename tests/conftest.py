"""Shared fixtures: the real `reconcile` CLI in a subprocess, on a node of its own.

``reconcile`` gives each test a :class:`Reconcile`: a tmp state dir, a tmp manifests
folder, a unique ``--node`` name, a static ``--devices`` inventory and a block of free
ports. Every engine a pass spawns carries ``RECONCILE_INSTANCE=<node>/<name>/<nonce>``;
at teardown the fixture kills every live process carrying ``<node>/`` and FAILS the test
if there was any: a test must leave nothing running (end it with ``reconcile.down()``).

Helper processes a test starts itself (a foreign listener, a daemon) go through
:meth:`Reconcile.spawn` / :meth:`Reconcile.popen`, which kill them at teardown.

``module_reconcile`` is the same for a whole module: a heavy scenario brought up once
for the tests that only look at it (tests/ux/test_ux_replicas.py); its check runs at
the module's end.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import popens
import pytest
import warmcli
import yaml
from hypothesis import HealthCheck, settings

# With CI=true a skip for a missing tool fails (tests/missing.py).
from missing import pytest_runtest_makereport  # noqa: F401
from procs import (
    GATEWAY_MARKER,
    alive,
    bindable,
    cmdline,
    environ,
    free_ports,
    held_ports,
    kill_cgroups,
    kill_marked,
    listen,
    marked_pids,
    release_ports,
    wait_for,
    wait_gone,
)
from workunits import work_unit

from controller.cli.render.views import status_item
from controller.core.manifest.quantity import parse_duration
from controller.core.state import Phase
from controller.store.instances.records import RecordStore

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
CLI_TIMEOUT = 60.0
# Verbs that read no manifests (after `logs`, `-f` means follow, as in kubectl).
NO_MANIFESTS = frozenset(
    {"status", "get", "describe", "logs", "schema", "devices", "drain", "uncordon", "events"}
    | {"--git", "source", "history", "rollback"}  # a git source names its own folder
)
TIMING = bool(os.environ.get("RECONCILE_TEST_TIMING"))  # print each CLI call's duration (-s)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the units of tests/workunits.py, given to the scheduler.

    pytest-xdist passes a group to its scheduler by appending ``@group`` to each test's
    nodeid on the worker (``item._nodeid``); pytest 9 derives nodeids from a structured
    id, so that write is lost and every test was scheduled alone (pytest-xdist#1386): the
    Ray tests ran on both workers, a Ray cluster built on each and again at each switch
    of module, and the namespace cluster's tests could run beside each other. The
    scheduler's own hook for a test's unit reads the nodeid here instead.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    # Units by their number of tests, most first (xdist's default, `loadscopereorder`):
    # every other test is a unit of its own, so the Ray unit (42 tests) is sent first and
    # its chain (~10 min under load, the run's longest) runs beside the rest from the
    # start, the files of one unit (workunits.ONE_WORKER_FILES, 11-25 tests) and the
    # namespace cluster's (2) next; the sort is stable, so the rest keep
    # collection order. In collection order the Ray unit was the 143rd (after tests/backends
    # and tests/cli): it started that much later.
    config.option.loadscopereorder = True
    return ByWorkUnit(config, log)


# Bytecode for the processes the tests start (each CLI call, daemon, gateway and demo
# engine imports `controller`): with PYTHONDONTWRITEBYTECODE=1, as a dev shell may set, each
# of those thousands of starts compiled ~120 modules again (~0.1 s of CPU a start, a
# quarter of a `--once`). Such a shell keeps its tree clean: the cache goes to /tmp.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    os.environ.setdefault(
        "PYTHONPYCACHEPREFIX", str(Path(tempfile.gettempdir(), f"reconcile-pyc-{os.getuid()}"))
    )


# Name the test that leaves a child process unreaped (tests/popens.py).
popens.track()

# Ctrl-C as a terminal gives it. A run started in the background by a shell without job
# control (`scripts/test &` in a script) inherits SIGINT ignored, and so would each CLI a
# test starts: Python then installs no KeyboardInterrupt handler, and the tests that press
# Ctrl-C (`status -w`, `--wait`) waited out their timeout (seen in a run started so). A
# handler of Python's own is reset to the default at exec, so the children get that.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionfinish(session: pytest.Session) -> None:
    warmcli.close()
    popens.report_running()


# A soak runs for about ten minutes by design (scripts/soak): it gets an hour, not the
# default run's five minutes (pyproject's `timeout`), unless it names its own.
SOAK_TIMEOUT = 3600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SOAK_TIMEOUT))


# The machine is noisy (2 cores, other suites running): no per-example deadlines.
settings.register_profile("reconcile", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# CI=true: the same examples on every run (derandomized), so a landing never fails on an
# example no one has seen; local runs and scripts/flakes keep looking for new ones (one
# found a property the planner's design did not hold: tests/core/test_plan_health.py).
settings.register_profile("ci", settings.get_profile("reconcile"), derandomize=True)
_PROFILE = "ci" if os.environ.get("CI") == "true" else "reconcile"
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", _PROFILE))


# -- manifests -----------------------------------------------------------------------------


def demo_command(**extra: str) -> list[str]:
    """The stand-in engine (``/health``) as an argv, with the test's own interpreter."""
    argv = [PYTHON, "-m", "controller.demo.engine", "--port", "{port}", "--model", "{name}"]
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}", value]
    return argv


def deployment(name: str, **spec: Any) -> dict[str, Any]:
    """A Deployment document: the demo engine, fast probes, a short grace period."""
    body: dict[str, Any] = {
        "engine": "command",
        "command": demo_command(),
        "readiness": {"httpGet": {"path": "/health"}, "deadlineSeconds": 30, "periodSeconds": 0.2},
        "stopGracePeriodSeconds": 2,
    }
    body.update(spec)
    return {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": body,
    }


def dump_yaml(*docs: Mapping[str, Any]) -> str:
    return yaml.safe_dump_all([dict(d) for d in docs], sort_keys=False)


# -- the CLI -------------------------------------------------------------------------------


class Result:
    """A finished CLI call; ``str()`` shows everything an assertion message needs."""

    def __init__(self, args: Sequence[str], proc: subprocess.CompletedProcess[str]) -> None:
        self.args = list(args)
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def json(self) -> Any:
        return json.loads(self.out)

    def __str__(self) -> str:
        return (
            f"reconcile {' '.join(self.args)} -> exit {self.code}\n"
            f"--- stdout\n{self.out[-4000:]}\n--- stderr\n{self.err[-4000:]}"
        )


class Reconcile:
    """The real CLI on a node of its own. ``reconcile("plan")`` runs a verb: forked from a
    process that imported it (tests/warmcli.py: a call's CPU is otherwise mostly imports),
    started cold where the call's environment is read at the start."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.node = f"t-{uuid.uuid4().hex[:12]}"
        self.state = tmp / "state"
        self.manifests = tmp / "manifests"
        self.manifests.mkdir()
        self.devices = "nvidia:0,nvidia:1"
        self.port = free_ports()
        self.env: dict[str, str] = {
            k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_")
        }
        self._helpers: list[subprocess.Popen[bytes] | warmcli.Started] = []

    # -- running the CLI ---------------------------------------------------------

    def argv(self, *args: str, common: bool = True) -> list[str]:
        """``python -m controller ARGS`` plus the node's options (after the verb)."""
        argv = [PYTHON, "-m", "controller", *args]
        if common:
            argv += ["--state-dir", str(self.state), "--node", self.node]
            argv += ["--devices", self.devices]
            wants_manifests = not any(a in NO_MANIFESTS for a in args)
            if wants_manifests and not any(a in ("-f", "--manifests") for a in args):
                argv += ["-f", str(self.manifests)]
        return argv

    def __call__(
        self,
        *args: str,
        check: int | None = None,
        common: bool = True,
        timeout: float = CLI_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> Result:
        """Run one CLI call; ``check`` asserts its exit code."""
        started = time.monotonic()
        argv, full_env = self.argv(*args, common=common), {**self.env, **(env or {})}
        # cold where an environment is read at the interpreter's start
        proc = warmcli.run_or_cold(argv, env=full_env, cwd=self.tmp, timeout=timeout)
        result = Result(args, proc)
        if TIMING:
            took = time.monotonic() - started
            print(f"[{took:5.2f}s] reconcile {' '.join(args)} -> {proc.returncode}")
        assert "Traceback (most recent call last)" not in result.err, str(result)
        if check is not None:
            assert result.code == check, str(result)
        return result

    def once(self, *args: str, check: int | None = 0) -> Result:
        return self("--once", *args, check=check)

    def converge(self, *args: str, timeout: str = "30s") -> Result:
        """``--once --wait``; the process gets the wait's ``timeout`` and then some."""
        limit = max(CLI_TIMEOUT, parse_duration(timeout) + 30)
        return self("--once", "--wait", "--timeout", timeout, *args, check=0, timeout=limit)

    def down(self, *args: str) -> Result:
        return self("down", *args, check=0)

    def follow(self, *args: str) -> tuple[subprocess.Popen[bytes], bytes]:
        """``logs ARGS -f`` in the background, once it has shown its first line (so it
        found the records and holds their files): a sleep here was shorter than a cold
        start under load, and a `down` that came first left it no deployment to follow.
        Its first line comes back beside it."""
        # Unbuffered: a buffered first read would hold lines communicate() never sees.
        proc = self.spawn(self.argv("logs", *args, "-f"), stdout=subprocess.PIPE, bufsize=0)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], CLI_TIMEOUT)
        first = proc.stdout.readline() if ready else b""
        assert first, f"logs {' '.join(args)} -f showed nothing in {CLI_TIMEOUT}s"
        return proc, first

    def popen(self, *args: str, **kwargs: Any) -> subprocess.Popen[bytes]:
        """The CLI in the background (the daemon); killed at teardown."""
        return self.spawn(self.argv(*args), **kwargs)

    def daemon(
        self, *args: str, stderr: Any = subprocess.DEVNULL, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes] | warmcli.Started:
        """``popen(ARGS)`` for a daemon: forked warm where it can be (tests/warmcli.py; a
        cold start's imports held its first pass back 1.6-3 s under load), in a process
        group of its own either way, and killed at teardown. ``stderr``: a file."""
        argv, env = self.argv(*args), self.env if env is None else env
        proc = warmcli.start(argv, env=env, cwd=self.tmp, stdout=subprocess.DEVNULL, stderr=stderr)
        if proc is None:
            return self.spawn(argv, stderr=stderr, env=env)
        self._helpers.append(proc)
        return proc

    def spawn(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Any helper process (a foreign listener...); killed and reaped at teardown with
        its whole process group: a helper that forks (``git daemon`` runs ``git-daemon``
        as its child) leaves nothing behind."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("stdout", subprocess.DEVNULL)
        kwargs.setdefault("stderr", subprocess.DEVNULL)
        kwargs.setdefault("cwd", self.tmp)
        kwargs.setdefault("env", self.env)
        if not kwargs.get("start_new_session"):  # a session is a group of its own already
            kwargs.setdefault("process_group", 0)
        proc = subprocess.Popen(list(argv), **kwargs)
        self._helpers.append(proc)
        return proc

    # -- manifests ---------------------------------------------------------------

    def write(self, name: str, *, folder: Path | None = None, **spec: Any) -> Path:
        """Write ``<folder>/<name>.yaml`` holding one demo Deployment (``spec`` overrides)."""
        spec.setdefault("basePort", self.port)
        return self.write_text(f"{name}.yaml", dump_yaml(deployment(name, **spec)), folder=folder)

    def write_text(self, file: str, text: str, *, folder: Path | None = None) -> Path:
        path = (folder or self.manifests) / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    # -- looking ----------------------------------------------------------------------

    def status(self, *names: str, cli: bool = False) -> dict[str, dict[str, Any]]:
        """``status -o json`` by name. In-process by default (the same view code, without
        a subprocess: a test reads status often); ``cli=True`` runs the real command."""
        if cli:
            items = self("status", *names, "-o", "json", check=0).json()
            assert isinstance(items, list), items
            return {item["name"]: item for item in items}
        records = RecordStore(self.state).peek().records  # as `status`: moving nothing
        return {
            name: json.loads(json.dumps(status_item(rec)))
            for name, rec in sorted(records.items())
            if not names or name in names
        }

    def end_backoff(self, *names: str) -> None:
        """End the back-offs of ``names`` (each in BackOff; none named: every record's) now:
        each record as the pass left it, its restart due, as once its wait is over. For a
        test of what the retry does, not of the back-off's length (tests/core's): it spends
        no 10 s and more of waiting, or of passes that move nothing, on it. No pass may run
        meanwhile (this writes the record a pass would)."""
        store = RecordStore(self.state)
        now = datetime.now(UTC)
        records = [store.read(name) for name in names] or list(store.peek().records.values())
        for rec in records:
            assert rec is not None and (rec.phase is Phase.BACKOFF or not names), rec
            if rec.phase is Phase.BACKOFF and rec.backoff_until and rec.backoff_until > now:
                store.write(replace(rec, backoff_until=now))

    def store(self) -> RecordStore:
        """The state dir's record store, for a test that forges or inspects records."""
        store = RecordStore(self.state)
        store.ensure()
        return store

    def record_path(self, name: str) -> Path:
        return self.state / "instances" / f"{name}.json"

    def record(self, name: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.record_path(name).read_text())
        except FileNotFoundError:
            return None
        return data

    def events(self, name: str) -> list[dict[str, Any]]:
        try:
            lines = (self.state / "events" / f"{name}.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def pids(self, name: str | None = None) -> set[int]:
        """Live processes carrying this node's marker (of one deployment, if named)."""
        return marked_pids(f"{self.node}/{name}/" if name else f"{self.node}/")

    # -- helpers, reachable through the fixture ----------------------------------------

    alive = staticmethod(alive)
    environ = staticmethod(environ)
    cmdline = staticmethod(cmdline)
    wait_gone = staticmethod(wait_gone)
    wait_for = staticmethod(wait_for)
    listen = staticmethod(listen)
    bindable = staticmethod(bindable)
    deployment = staticmethod(deployment)
    dump_yaml = staticmethod(dump_yaml)
    demo_command = staticmethod(demo_command)

    # -- teardown -----------------------------------------------------------------

    def _teardown(self) -> dict[int, str]:
        # A daemon's gateway process outlives it by design (tests/gateway checks they end).
        kill_marked(f"{self.node}/", marker=GATEWAY_MARKER)
        leftovers = kill_marked(f"{self.node}/")
        kill_cgroups(self.state)  # an engine's escaped child; an empty engine cgroup
        for proc in self._helpers:
            # Its group, so what it forked goes too; only while it is unreaped, so its pid
            # (the group's id) cannot name another process (pid_max can be 32768).
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()  # one that moved itself to another group
            proc.wait(timeout=10)
        return leftovers


@pytest.fixture(autouse=True)
def _ports_given_back() -> Iterator[None]:
    """The port blocks a test took (procs.free_ports) are given back once it and its
    fixtures have ended; a module's or session's fixtures, set up before, keep theirs."""
    before = held_ports()
    yield
    release_ports(held_ports() - before)


@pytest.fixture
def reconcile(tmp_path: Path) -> Iterator[Reconcile]:
    """The real CLI with its own state dir, manifests folder, node, devices and ports.

    Teardown kills every process carrying this node's marker and fails the test if
    any was still running: end a test with ``reconcile.down()``.
    """
    rc = Reconcile(tmp_path)
    yield rc
    _nothing_left(rc)


@pytest.fixture(scope="module")
def module_reconcile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reconcile]:
    """``reconcile`` for a whole module: a heavy scenario set up once for the tests that
    only look at it (they must change nothing). The same check at the module's end."""
    rc = Reconcile(tmp_path_factory.mktemp("module"))
    yield rc
    _nothing_left(rc)


def _nothing_left(rc: Reconcile) -> None:
    leftovers = rc._teardown()
    if leftovers:
        shown = "\n".join(f"  pid {pid}: {cmd}" for pid, cmd in sorted(leftovers.items()))
        pytest.fail(f"engines of node {rc.node} were left running (now killed):\n{shown}")
