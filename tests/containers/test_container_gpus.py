"""The leased GPUs go into the container, named as the runtimes name them.

No GPU here, so NVIDIA's part is played by a CDI spec this test writes: podman reads the
specs in /var/run/cdi and applies the edits of each device a run names (here, an
environment variable per GPU), as it would apply the device nodes and libraries of
the spec ``nvidia-ctk cdi generate`` writes. The container is started as a real launch
of the local backend with a real (not static) inventory; the engine prints its
environment into the deployment's log. Docker's ``--gpus`` needs NVIDIA's hook or its
CDI driver, neither of which installs without a GPU: its argv is checked, and
``scripts/gpu-check`` runs it on a GPU host.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from containers.conftest import Engine
from procs import free_ports, wait_for
from strategies import entry

from controller.backends.base import StartRequest
from controller.backends.local.container import Passed, container_env, device_flags
from controller.backends.local.runtime import LocalBackend
from controller.core.devices.inventory import Device
from controller.core.render import render
from controller.core.state import Record

CDI_DIR = Path("/var/run/cdi")  # one of the two folders podman reads CDI specs from
OURS = "reconcile-test-"  # the specs these tests write
CDI_TURNS = Path("/tmp/reconcile-test-cdi.lock")  # held while one of them is written
# Each fake GPU's edit: a variable naming it, so the engine can say which it was given.
CDI_SPEC = """cdiVersion: "0.5.0"
kind: "nvidia.com/gpu"
devices:
{devices}
"""
CDI_DEVICE = '- name: "{i}"\n  containerEdits:\n    env: ["PASSED_GPU_{i}=yes"]\n'
SAYS_ENV = ["/bin/busybox", "sh", "-c", 'env; trap "exit 0" TERM; sleep 600 & wait']


@pytest.fixture
def cdi_gpus() -> Iterator[None]:
    """Four fake NVIDIA GPUs (0-3) in a CDI spec of this test's own, removed after."""
    if os.geteuid() != 0:
        pytest.skip("writing a CDI spec into /var/run/cdi needs root (CI runs as root)")
    # Two specs naming one device make it unresolvable (CDI refuses the conflict): the
    # tests that write one take turns. Without the turns, a test on another worker read
    # its sibling's spec as the host's own GPUs and skipped (a CI run, 2026-12-07).
    with CDI_TURNS.open("w") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)  # released as the file closes
        for stale in CDI_DIR.glob(f"{OURS}*.yaml"):  # a killed run's, never a live one's
            stale.unlink()
        others = [p for d in (CDI_DIR, Path("/etc/cdi")) if d.is_dir() for p in d.iterdir()]
        if any("nvidia.com/gpu" in p.read_text(errors="replace") for p in others if p.is_file()):
            pytest.skip("this host has a CDI spec of NVIDIA GPUs: scripts/gpu-check covers it")
        CDI_DIR.mkdir(parents=True, exist_ok=True)
        spec = CDI_DIR / f"{OURS}{uuid.uuid4().hex[:8]}.yaml"
        spec.write_text(CDI_SPEC.format(devices="".join(CDI_DEVICE.format(i=i) for i in range(4))))
        try:
            yield
        finally:
            spec.unlink()


def test_podman_gets_the_leased_gpus_by_cdi_and_the_engine_numbers_them_from_zero(
    podman: Engine, cdi_gpus: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _leased_1_and_3(podman, podman.image, tmp_path, monkeypatch)
    given = sorted(k for k in env if k.startswith("PASSED_GPU_"))
    assert given == ["PASSED_GPU_1", "PASSED_GPU_3"]  # those two, no other
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # inside, the container's own two


def test_an_images_nvidia_visible_devices_all_is_replaced_by_the_leased_gpus(
    podman: Engine, cdi_gpus: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA images set NVIDIA_VISIBLE_DEVICES=all, and NVIDIA's OCI hook (run for every
    container where nvidia-container-toolkit installed it) passes every GPU it names:
    the engine got all of them beside the two CDI passed, its GPU "0" the host's first,
    another deployment's. It names the leased ones now, as Kubernetes' plugin does."""
    tag = f"localhost/reconcile-test/cuda-like:{uuid.uuid4().hex[:10]}"
    image = podman.build(tag, env="NVIDIA_VISIBLE_DEVICES=all")
    env = _leased_1_and_3(podman, image, tmp_path, monkeypatch)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "1,3", env


def _leased_1_and_3(
    podman: Engine, image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """The environment an engine in ``image`` that leased GPUs 1 and 3 sees, launched as
    the local backend launches it with a real (not static) inventory; torn down after."""
    for key, value in podman.env.items():
        monkeypatch.setenv(key, value)
    state = tmp_path / "state"
    backend = LocalBackend(state, "gpu-node", container_runtime="podman", static_devices=False)
    spec = {"container": {"image": image}, "devices": {"count": 2}}
    deployment = entry("g", engine="command", command=SAYS_ENV, **spec)
    devices = (Device(kind="nvidia", id="1"), Device(kind="nvidia", id="3"))
    port = free_ports(1)
    rendered = render(deployment, devices=devices, port=port)
    assert rendered.env["CUDA_VISIBLE_DEVICES"] == "1,3"  # on the host: the leased ones
    keys = tuple(d.key for d in devices)
    record = Record(name="g", owner="test", node="gpu-node", nonce="n1", port=port, devices=keys)
    log = state / "g.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    request = StartRequest(entry=deployment, record=record, rendered=rendered, log_path=log)
    instance = backend.launch(request)
    try:
        said = lambda: log.read_text() if log.exists() else ""  # noqa: E731
        wait_for(lambda: "PASSED_GPU_" in said(), timeout=60, what="the engine's environment")
        env = dict(line.split("=", 1) for line in said().splitlines() if "=" in line)
    finally:  # the daemon's stop: the runtime's stop and rm, then the process's
        backend.teardown(
            dataclasses.replace(record, ref=instance.ref, container=instance.container)
        )
    wait_for(lambda: not podman.ours(state), timeout=20, what="the container removed")
    return env


def test_the_runtimes_flags_name_each_gpu_by_its_index() -> None:
    local = Passed.of(("nvidia:1", "nvidia:3"))
    assert device_flags("podman", local) == [
        "--device", "nvidia.com/gpu=1", "--device", "nvidia.com/gpu=3",
    ]  # fmt: skip
    # docker's own quoting: the comma would otherwise split its --gpus options
    assert device_flags("docker", local) == ["--gpus", '"device=1,3"']
    ray = Passed.of(("0", "2"))  # a Ray actor's ray.get_gpu_ids()
    assert device_flags("podman", ray) == ["--device", "nvidia.com/gpu=0", "--device",
                                           "nvidia.com/gpu=2"]  # fmt: skip
    amd = Passed.of(("amd:1",))
    assert device_flags("docker", amd) == ["--device", "/dev/kfd", "--device", "/dev/dri"]
    assert device_flags("podman", Passed.of(("apple:0", "cpu:0"))) == []


def test_amd_gpus_keep_the_hosts_numbers_inside() -> None:
    """Every render node is passed, so the container sees the host's GPUs in the host's
    order: the visibility variables keep the leased ones' host numbers."""
    rendered = render(
        entry("a", engine="command", command=["x"], devices={"count": 1}, container={"image": "i"}),
        devices=(Device(kind="amd", id="2"),),
        port=9000,
    )
    env = container_env(rendered.env, Passed.of(("amd:2",)))
    assert env["HIP_VISIBLE_DEVICES"] == env["ROCR_VISIBLE_DEVICES"] == "2"
