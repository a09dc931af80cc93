"""What each command imports: the read verbs never pay for pydantic, quiet passes for structlog.

Lazy imports are what keeps `reconcile status` as quick as `supervisorctl status`; a
module-level import of the specs from the records (or the views) would undo it silently.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
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
