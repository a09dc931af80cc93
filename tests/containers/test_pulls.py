"""Image pulls as a declared step, from a real registry on loopback (``docker-registry``):
by tag, by digest, a wrong digest, a registry that is down; on podman and docker.

The stand-in image is pushed once per session; each test removes what it pulled.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from containers.conftest import Engine, write
from missing import skip
from procs import free_ports, wait_for

if TYPE_CHECKING:
    from conftest import Reconcile

REGISTRY_CONF = """\
version: 0.1
log: {{level: warn}}
storage:
  filesystem: {{rootdirectory: {root}}}
http: {{addr: "127.0.0.1:{port}"}}
"""


@dataclass
class Registry:
    address: str  # 127.0.0.1:<port>
    digest: str  # the pushed image's manifest digest
    registries_conf: Path  # podman: these loopback registries speak plain HTTP

    @property
    def tagged(self) -> str:
        return f"{self.address}/reconcile-test/engine:1"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, podman: Engine) -> Iterator[Registry]:
    if shutil.which("docker-registry") is None:
        skip("docker-registry", "apt-get install docker-registry")
    root = tmp_path_factory.mktemp("registry")
    port = free_ports(2)
    (root / "config.yml").write_text(REGISTRY_CONF.format(root=root / "data", port=port))
    server = subprocess.Popen(
        ["docker-registry", "serve", str(root / "config.yml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: _answers(port), timeout=30, what="the registry")
        conf = root / "registries.conf"
        lines = [
            f'[[registry]]\nlocation = "127.0.0.1:{p}"\ninsecure = true\n' for p in (port, port + 1)
        ]
        conf.write_text("\n".join(lines))
        address = f"127.0.0.1:{port}"
        digest_file = root / "digest"
        target = f"{address}/reconcile-test/engine:1"
        # An image no store here holds (as a registry's would be): pushed, then removed.
        pushed = podman.build(f"localhost/reconcile-test/pushed:{port}", extra=str(port).encode())
        podman.cli("push", "--tls-verify=false", "--format", "v2s2", "--digestfile",
                   str(digest_file), pushed, target)  # fmt: skip
        podman.cli("rmi", "-f", pushed)
        yield Registry(address, digest_file.read_text().strip(), conf)
    finally:
        server.terminate()
        server.wait(timeout=10)


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@pytest.fixture
def pulling(rc: Reconcile, engine: Engine, registry: Registry) -> Iterator[Reconcile]:
    """``rc`` with the registry reachable; every image of the registry pulled is removed."""
    rc.env["CONTAINERS_REGISTRIES_CONF"] = str(registry.registries_conf)
    _forget(engine, registry)
    yield rc
    _forget(engine, registry)


def _forget(engine: Engine, registry: Registry) -> None:
    """Remove every image of the registry this runtime holds, by reference and by id."""
    refs = [registry.tagged, f"{registry.address}/reconcile-test/engine@{registry.digest}"]
    out = engine.cli("images", "--digests", "--format", "{{.Repository}} {{.ID}}")
    ids = [line.split()[1] for line in out.splitlines() if line.startswith(registry.address)]
    for ref in [*refs, *ids]:
        engine.cli("rmi", "-f", ref, check=False)
    for ref in refs:
        assert engine.cli("image", "inspect", ref, check=False) == "" or not _held(engine, ref)


def _held(engine: Engine, ref: str) -> bool:
    done = subprocess.run([engine.name, "image", "inspect", ref], capture_output=True,
                          env={**os.environ, **engine.env}, timeout=60)  # fmt: skip
    return done.returncode == 0


def until_message(rc: Reconcile, name: str, text: str) -> dict[str, Any]:
    """Passes until the record's message says ``text`` (a pull ends between passes)."""

    def said() -> dict[str, Any] | None:
        rc.once(check=None)
        record = rc.record(name)
        return record if record is not None and text in record["message"] else None

    found: dict[str, Any] = wait_for(said, timeout=90, what=f"{name!r} saying {text!r}")
    return found


@pytest.mark.parametrize("by", ["tag", "digest"])
def test_an_image_is_pulled_first_holding_nothing_then_runs(
    pulling: Reconcile, engine: Engine, registry: Registry, by: str
) -> None:
    rc = pulling
    image = registry.tagged
    if by == "digest":
        image = f"{registry.address}/reconcile-test/engine@{registry.digest}"
    write(rc, engine, "pulled", container={"image": image})
    rc.once(check=None)
    first = rc.record("pulled")
    # A small image may be pulled before the pass's next round: then it is Starting.
    assert first is not None and first["phase"] in ("Pulling", "Starting", "Ready"), first
    if first["phase"] == "Pulling":  # holding nothing while the pull runs
        assert first["port"] is None and first["devices"] == [], first
        assert f"pulling image {image}" in first["message"]
    rc.converge(timeout="60s")
    record = rc.record("pulled")
    assert record is not None and record["phase"] == "Ready", record
    assert record["container"]["image"] == image
    assert record["container"]["digest"] == registry.digest
    events = rc.events("pulled")
    outcomes = [e.get("outcome") for e in events]
    assert "pulling" in outcomes, outcomes
    # The pull's end is an event with the digest, and describe shows it.
    [done] = [e for e in events if e.get("outcome") == "pulled"]
    assert done["digest"] == registry.digest and done["image"] == image, done
    described = rc("describe", "pulled", check=0).out
    assert f"image {image} pulled: {registry.digest}" in described, described
    rc.down()


def test_a_wrong_digest_is_named_with_the_runtimes_words(
    pulling: Reconcile, engine: Engine, registry: Registry
) -> None:
    rc = pulling
    image = f"{registry.address}/reconcile-test/engine@sha256:{'0' * 64}"
    write(rc, engine, "wrong", container={"image": image})
    record = until_message(rc, "wrong", "cannot pull image")
    assert record["phase"] in ("BackOff", "Pending"), record
    assert image in record["message"] and "manifest unknown" in record["message"].lower()
    assert engine.ours(rc.state) == []
    rc.down()


def test_a_registry_that_is_down_is_named_and_retried(
    pulling: Reconcile, engine: Engine, registry: Registry
) -> None:
    rc = pulling
    host, port = registry.address.split(":")
    image = f"{host}:{int(port) + 1}/reconcile-test/engine:1"  # nothing listens there
    write(rc, engine, "down", container={"image": image})
    record = until_message(rc, "down", "cannot pull image")
    assert image in record["message"] and "connection refused" in record["message"].lower()
    assert record["phase"] == "BackOff" and record["backoff_until"] is not None, record
    assert engine.ours(rc.state) == []
    rc.down()
