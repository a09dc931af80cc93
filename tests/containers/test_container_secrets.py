"""spec.envFrom in a container, on real podman and docker: the values reach the engine's
environment through the runtime's own (``--env KEY``), never an argv or a state-dir file."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from containers.conftest import Engine, write
from envfrom.agekey import make_key

if TYPE_CHECKING:
    from conftest import Reconcile


def _argvs_holding(value: str) -> list[int]:
    """Every process on this machine whose command line holds ``value``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if value.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:  # gone meanwhile
            continue
    return found


def _files_holding(rc: Reconcile, value: str) -> list[Path]:
    files = (p for p in rc.state.rglob("*") if p.is_file())
    return [p for p in files if value.encode() in p.read_bytes()]


def test_env_from_reaches_the_container_and_no_argv_or_file(rc: Reconcile, engine: Engine) -> None:
    on_node, in_repo = f"hf-{uuid.uuid4().hex}", f"api-{uuid.uuid4().hex}"
    node_file = rc.tmp / "node" / "hf.env"
    node_file.parent.mkdir()
    node_file.write_text(f"HF_TOKEN={on_node}\n")
    node_file.chmod(0o600)
    key = make_key(rc.tmp / "keys")
    key.encrypt(f"API_KEY={in_repo}\n", rc.manifests / "secrets" / "api.env")
    rc.env["SOPS_AGE_KEY_FILE"] = str(key.file)
    write(rc, engine, "box", envFrom=[{"file": str(node_file)}, {"sopsFile": "secrets/api.env"}])
    # Killed while `run` starts, before the env file is removed: what is left on disk holds
    # no value (the values never were in the file).
    point = "container.run.before_wait=kill"
    killed = rc("--once", check=None, env={"RECONCILE_FAILPOINTS": point})
    assert killed.code == -signal.SIGKILL, str(killed)
    assert list((rc.state / "run").glob("*.env")), "the env file a crash leaves behind"
    assert _files_holding(rc, on_node) == _files_holding(rc, in_repo) == []
    rc.converge()
    record = rc.record("box")
    assert record is not None and record["phase"] == "Ready", record
    env = rc.environ(record["ref"]["pid"])
    assert (env["HF_TOKEN"], env["API_KEY"]) == (on_node, in_repo)
    for value in (on_node, in_repo):
        assert _argvs_holding(value) == []  # the runtime's `run` took it from its env
        files = [
            p
            for p in rc.state.rglob("*")
            if p.is_file() and value in p.read_text("utf-8", "replace")
        ]
        assert files == [], files
    rc.down()
    assert engine.ours(rc.state) == []
