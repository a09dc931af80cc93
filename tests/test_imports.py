"""What each command imports: the read verbs never pay for pydantic, quiet passes for structlog.

Lazy imports are what keeps `reconcile status` as quick as `supervisorctl status`; a
module-level import of the specs from the records (or the views) would undo it silently.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from procs import free_ports
from strategies import record

from controller.core.state import Phase
from controller.store.instances.records import RecordStore

# Runs one command in a fresh interpreter, then says which of the heavy modules it imported.
PROBE = (
    "import sys; from controller.cli.main import main; "
    "rc = main(sys.argv[2:]); "
    "bad = [m for m in sys.argv[1].split(',') if m in sys.modules]; "
    "sys.exit(f'imported: {bad}' if bad else 0)"
)


def _run(modules: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, modules, *argv], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A state dir with one Ready record and its log, for describe and logs to show."""
    store = RecordStore(tmp_path / "s")
    store.ensure()
    store.write(record("web", phase=Phase.READY))
    store.log_path("web").write_text("listening on 8000\n")
    return store.state_dir


# status is the quickest verb: nothing but the records. The others may read YAML (describe
# shows the spec as YAML), but none of them validates a manifest.
# Nor, on a node that follows no git source, the git source's module and subprocess (or
# difflib, which only an error's "did you mean" needs): ~8 ms of the ~140 a `status` takes.
STATUS = (
    "pydantic,yaml,structlog,psutil,aiohttp,subprocess,difflib,controller.store.sources.git.source"
)
READING = "pydantic,structlog,aiohttp"


@pytest.mark.parametrize(
    ("verb", "modules"),
    [
        (["status"], STATUS),
        (["status", "-o", "json"], STATUS),
        (["describe", "web"], READING),
        (["logs", "web"], READING),
        (["devices", "--devices", "nvidia:0,nvidia:1"], READING),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_read_verbs_import_no_pydantic(state: Path, verb: list[str], modules: str) -> None:
    out = _run(modules, [*verb, "--state-dir", str(state), "--node", "n"])
    assert out.returncode == 0, out.stderr + out.stdout


# A pass on a folder, with no hooks and no envFrom, loads neither the git source nor the
# hooks' queue nor the secrets reader (~5 ms of each `--once`, a test suite's thousands);
# on a node that never pulled an image, no container code (~9 ms).
UNUSED_BY_A_PLAIN_PASS = ",".join(
    f"controller.{m}"
    for m in (
        "store.sources.git.source",
        "store.instances.outbox",
        "host.secrets",
        "backends.local.container",
        "host.containers",
        "core.kubernetes.export",
    )
)


@pytest.mark.parametrize("argv", [["--once", "-q"], ["--once", "--wait", "-q"]])
def test_quiet_passes_import_no_structlog(tmp_path: Path, argv: list[str]) -> None:
    common = ["--allow-empty", "-f", f"{tmp_path}/m", "--state-dir", f"{tmp_path}/s", "--node", "q"]
    out = _run(f"structlog,aiohttp,{UNUSED_BY_A_PLAIN_PASS}", [*argv, *common])
    assert out.returncode == 0, out.stderr


def test_the_command_line_entry_exits_with_the_command_s_code(tmp_path: Path) -> None:
    """`python -m controller` goes through entry(): its exit code is the command's."""
    (tmp_path / "bad.yaml").write_text("apiVersion: [\n")
    out = subprocess.run(
        [sys.executable, "-m", "controller", "validate", "-f", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "bad.yaml:2" in out.stderr, out.stderr


# `plan` asks a URL source's server for its size (urllib): a folder with no URL source
# loads no HTTP client, nor the ssl it brings (~20 ms of each `plan`).
NO_HTTP_CLIENT = "ssl,http.client,urllib.request,huggingface_hub"


def test_a_plan_with_no_url_source_imports_no_http_client(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "web.yaml").write_text(
        "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: web}\n"
        "spec: {engine: command, command: [engine, --port, '{port}'], basePort: 20400}\n"
    )
    common = ["-f", f"{tmp_path}/m", "--state-dir", f"{tmp_path}/s", "--node", "p"]
    out = _run(NO_HTTP_CLIENT, ["plan", *common, "--devices", "nvidia:0"])
    assert out.returncode == 0 and "+ web  create" in out.stdout, out.stderr + out.stdout


# The product's other processes, each up to the moment it serves: the test suite starts
# thousands of them, and a cron `--once` or a restarted engine waits on each start.
def _held(probe: str, modules: str, argv: list[str], **env: str) -> None:
    """Runs ``probe`` (which exits 0 once the process serves) in a fresh interpreter, then
    says which of ``modules`` it had imported by then."""
    report = "bad = [m for m in sys.argv[1].split(',') if m in sys.modules]; "
    out = subprocess.run(
        [sys.executable, "-c", probe.replace("REPORT", report), modules, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert out.returncode == 0, out.stderr + out.stdout


# The demo engine (the suite's stand-in engine) to its first answer: its own small HTTP
# server on socketserver (controller/demo/httpserver.py), no http.server (which brings
# email, html, mimetypes and, through http.client, ssl: ~2/3 of its start, and the suite
# starts ~1,700 demo engines a run). No typing (its annotations are strings), no
# dataclasses (inspect, ~15% of its start), no OpenSSL until an embedding asks for a
# SHA-256. (The probe's own client is http.client.)
DEMO_PROBE = (
    "import http.client, os, sys, threading, time; from controller.demo.engine import main\n"
    "def up(port):\n"
    "    try:\n"
    "        c = http.client.HTTPConnection('127.0.0.1', port, timeout=5)\n"
    "        c.request('GET', '/health')\n"
    "        return c.getresponse().status == 200\n"
    "    except OSError:\n"
    "        return False\n"
    "def answered():\n"
    "    end = time.monotonic() + 30\n"
    "    while not up(int(sys.argv[2])):\n"
    "        if time.monotonic() > end: print('never answered', flush=True); os._exit(1)\n"
    "        time.sleep(0.02)\n"
    "    REPORT print(f'imported: {bad}' if bad else 'ok', flush=True); os._exit(1 if bad else 0)\n"
    "threading.Thread(target=answered, daemon=True).start(); main(['--port', sys.argv[2]])"
)
DEMO_UNUSED = (
    "http.server,html,mimetypes,typing,dataclasses,inspect,hashlib,_hashlib,asyncio,"
    "pydantic,controller.core,controller.store"
)


def test_a_demo_engine_answers_with_no_dataclasses_nor_openssl() -> None:
    _held(DEMO_PROBE, DEMO_UNUSED, [str(free_ports(1))])


# tests/gateway/echo_engine.py (the gateway tests' engine that says what reached it) to its
# first answer: on the demo engine's server, not aiohttp (~0.3 s of CPU a start, ~30 a run).
ECHO_DIR = str(Path(__file__).with_name("gateway"))
ECHO_PROBE = DEMO_PROBE.replace(
    "from controller.demo.engine import main",
    f"sys.path.insert(0, {ECHO_DIR!r}); from echo_engine import main",
).replace("main(['--port', sys.argv[2]])", "main(['--port', sys.argv[2], '--model', 'm'])")
ECHO_UNUSED = "aiohttp,asyncio,yarl,multidict"


def test_the_echo_engine_answers_with_no_aiohttp() -> None:
    _held(ECHO_PROBE, ECHO_UNUSED, [str(free_ports(1))])


# The gateway process (`python -m controller.gateway`) on a node that follows no git
# source: no git source (its codecs, git's runner), loaded by the page or a webhook when
# there is one; no pydantic, yaml or structlog either. No aiohttp at all (a quarter of its
# start): the engines' /metrics are read with its own client (http/upstream.py).
# No prometheus_client until a scrape or a hand-over's inherit (its package's import
# brings http.server, http.client, email and wsgiref: ~35-50 ms of CPU a start).
GATEWAY_PROBE = "import sys; import controller.gateway.lifecycle.process; REPORT sys.exit(bad or 0)"
GATEWAY_UNUSED = (
    "controller.store.sources.git.source,controller.store.sources.git.status,"
    "pydantic,yaml,structlog,psutil,aiohttp,yarl,prometheus_client"
)


def test_a_gateway_starts_with_no_git_source_nor_aiohttp() -> None:
    _held(GATEWAY_PROBE, GATEWAY_UNUSED, [])


# The daemon (no --listen, no git source) to its first pass done (READY=1 on
# $NOTIFY_SOCKET): no HTTP (aiohttp, asyncio, ssl), no metrics exporter, no gateway.
DAEMON_PROBE = (
    "import os, socket, sys, threading; from controller.cli.main import main; "
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(os.environ['NOTIFY_SOCKET'])\n"
    "def ready():\n"
    "    while b'READY=1' not in s.recv(4096): pass\n"
    "    REPORT print(f'imported: {bad}' if bad else 'ok', flush=True); os._exit(1 if bad else 0)\n"
    "threading.Thread(target=ready, daemon=True).start(); main(sys.argv[2:]); sys.exit('ended')"
)
DAEMON_UNUSED = (
    "aiohttp,asyncio,ssl,prometheus_client,psutil,controller.gateway,controller.daemon.metrics,"
    "controller.store.sources.git.source"
)


def test_a_daemon_s_first_pass_imports_no_http_nor_gateway(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    common = ["--allow-empty", "-f", f"{tmp_path}/m", "--state-dir", f"{tmp_path}/s"]
    argv = ["-q", *common, "--node", "d", "--devices", "nvidia:0"]
    _held(DAEMON_PROBE, DAEMON_UNUSED, argv, NOTIFY_SOCKET=str(tmp_path / "notify"))


# The Ray driver process (`driverproc.py`: a child of each Ray CLI call, and of the
# daemon) up to its ray.init: it holds the actors' handles and runs no engine, so the local
# backend's spawn, the container runtimes, the ports and the planner's back-off are
# imported by the actor on its node (ray/actor.py), as the fetchers by the pull actor
# (ray/pullactor.py), never here: they were ~0.12 s of the ~0.9 s of CPU a driver start
# takes, and each Ray CLI call starts one.
RAY_DRIVER_PROBE = "import sys, controller.backends.ray.driverproc; REPORT sys.exit(bad or 0)"
RAY_DRIVER_UNUSED = (
    "controller.backends.ray.nodeengine,controller.backends.local.runtime,"
    "controller.backends.local.container,controller.host.containers,controller.host.ports,"
    "controller.core.plan,controller.core.planner,controller.pull.worker,controller.pull.hubfetch,"
    "controller.pull.urlfetch"
)


NO_RAY = importlib.util.find_spec("ray") is None


@pytest.mark.skipif(NO_RAY, reason="the ray extra is not installed")
def test_the_ray_driver_process_imports_no_engine_machinery() -> None:
    _held(RAY_DRIVER_PROBE, RAY_DRIVER_UNUSED, [])
