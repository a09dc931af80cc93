"""The ray backend's configuration and refusals: no cluster needed (or an unreachable one)."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from typing import Any

import pytest
from rayhelp import engines_gone, ray_engines
from strategies import record

from controller.core.state import Phase

GPU = {"count": 1, "kind": "nvidia"}


def test_ray_without_an_address_is_a_usage_error(reconcile: Any) -> None:
    reconcile.env.pop("RAY_ADDRESS", None)
    got = reconcile("--once", "--backend", "ray", check=64)
    assert "--ray-address" in got.err


def test_unreachable_cluster_exits_1_and_touches_no_record(reconcile: Any) -> None:
    reconcile.write("web")
    reconcile.converge()  # a local record exists
    before = reconcile.record_path("web").read_bytes()
    got = reconcile("--once", "--backend", "ray", "--ray-address", "127.0.0.1:9", check=1)
    assert "cannot reach the Ray cluster at 127.0.0.1:9" in got.err
    assert reconcile.record_path("web").read_bytes() == before
    reconcile.down()


def test_a_head_that_takes_connections_but_says_nothing_is_said_gone_in_seconds(
    reconcile: Any,
) -> None:
    """A GCS whose process is stopped (or whose host froze) still takes connections, in its
    kernel: the head was checked by a TCP connect alone, so the driver's join waited out
    its 90 s before saying it did not join (and a pass's look its 40 s). The GCS process is
    asked now (an HTTP/2 preface, which a running one answers at once): exit 1 in
    seconds, saying so and the next move, no record touched."""
    reconcile.write("web")
    reconcile.converge()  # a local record exists
    before = reconcile.record_path("web").read_bytes()
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never accepts
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        got = reconcile("--once", "--backend", "ray", "--ray-address", address, check=1)
    said = f"Ray cluster at {address}: the Ray cluster did not answer: its GCS took a connection"
    assert said in got.err and "said nothing in 5s" in got.err, got.err
    assert "ray start --head" in got.err and "Traceback" not in got.err, got.err
    assert reconcile.record_path("web").read_bytes() == before
    reconcile.down()


@pytest.mark.parametrize(
    ("address", "said"),
    [("10.0.0.1", "no port in it"), ("ray://10.0.0.1:10001", "Ray Client is not supported")],
)
def test_an_address_that_is_not_a_gcs_host_port_says_so(
    reconcile: Any, address: str, said: str
) -> None:
    reconcile.write("web")
    got = reconcile("--once", "--backend", "ray", "--ray-address", address, check=1)
    assert f"--ray-address {address}: {said}" in got.err, got.err
    assert "HOST:PORT" in got.err and "Traceback" not in got.err, got.err
    assert not reconcile.record_path("web").exists()


def test_describe_of_a_ray_record_shows_it_while_the_cluster_is_unreachable(
    reconcile: Any,
) -> None:
    """The cluster down (or a wrong address): the record and its events are still read
    here; only the log, on the engine's node, is not. describe printed nothing, exit 1."""
    reconcile.write("web")
    reconcile.converge()
    store = reconcile.store()
    local = store.read("web")
    assert local is not None
    store.write(dataclasses.replace(local, backend="ray", node="ab" * 28, host="10.0.0.7"))
    try:
        flags = ("--backend", "ray", "--ray-address", "127.0.0.1:9")
        got = reconcile("describe", "web", *flags, check=0)
    finally:
        store.write(local)  # the local engine's record again, for down
        reconcile.down()
    assert "Name:         web" in got.out and "Events:" in got.out, got.out
    assert "<not read: cannot reach the Ray cluster at 127.0.0.1:9" in got.out, got.out


def test_describe_of_a_ray_deployment_that_never_started_asks_nothing_of_the_cluster(
    reconcile: Any,
) -> None:
    """Pending since it was written (no instance, so no log on any node): describe shows it
    without a Ray driver (~1 s of CPU a call), so with the cluster unreachable it says
    nothing of the cluster: it said its log was "<not read: cannot reach...>"."""
    reconcile.store().write(record("web", phase=Phase.PENDING, backend="ray", nonce=None, node=""))
    flags = ("--backend", "ray", "--ray-address", "127.0.0.1:9")
    got = reconcile("describe", "web", *flags, check=0)
    assert "Name:         web" in got.out and "Phase:" in got.out, got.out
    assert "<not read" not in got.out and "<none>" in got.out, got.out


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"devices": {**GPU, "candidates": ["0"]}}, "spec.devices.candidates"),
        ({"port": 18080, "basePort": None}, "spec.port"),
        ({"devices": {"count": 1, "kind": "amd"}}, "spec.devices.kind"),
    ],
    ids=["candidates", "exact-port", "amd"],
)
def test_fields_without_cluster_meaning_are_refused(
    reconcile: Any, spec: dict[str, Any], field: str
) -> None:
    path = reconcile.write("web", **spec)
    if spec.get("basePort", 1) is None:  # an exact port instead of the fixture's basePort
        path.write_text(path.read_text().replace("basePort: null\n", ""))
    ray_flags = ("--backend", "ray", "--ray-address", "127.0.0.1:9")
    got = reconcile("validate", *ray_flags, check=1)
    assert field in got.err and "ray" in got.err
    reconcile("validate", check=0)  # the local backend takes it


def test_the_local_backend_never_imports_ray(reconcile: Any) -> None:
    reconcile.write("web")
    code = (
        "import sys; from controller.cli.main import main; rc = main(sys.argv[1:]);"
        " assert 'ray' not in sys.modules, 'ray imported'; sys.exit(rc)"
    )
    argv = [sys.executable, "-c", code, *reconcile.argv("--once")[3:]]
    proc = subprocess.run(argv, capture_output=True, text=True, env=reconcile.env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    reconcile.down()


def test_another_clusters_engine_is_not_the_tests_to_judge() -> None:
    """An engine of a Ray cluster this run did not start (`ray start` by hand, another
    checkout's tests on the same box) is not waited for, named or killed by a teardown:
    it was, and a run failed "engines outlived their actors" over another run's engines."""
    env = {
        **os.environ,
        "RECONCILE_STATE": "/tmp/reconcile-ray/reconcile-elsewhere",
        "RECONCILE_INSTANCE": "node/web/nonce",
        "RAY_RAYLET_PID": "1",  # a raylet that is none of ours
    }
    other = subprocess.Popen(["sleep", "60"], env=env)
    try:
        assert other.pid not in ray_engines()
        engines_gone(timeout=0.5, kill=True)
        assert other.poll() is None, "another cluster's engine was killed"
    finally:
        other.kill()
        other.wait()
