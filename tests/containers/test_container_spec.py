"""spec.container as written: validation with file, line and field; the defaults; the
recipe's image and program; export's image; node.yaml's default runtime. No runtime
is run here."""

from __future__ import annotations

from pathlib import Path

import pytest
from strategies import deployment, entry

from controller.core.devices.inventory import Device
from controller.core.engines import llama_cpp, vllm
from controller.core.kubernetes.export import export, image_of
from controller.core.manifest.specs import Container, spec_hash
from controller.core.render import container_image, render
from controller.errors import ConfigError
from controller.host.containers import default_runtime
from controller.store.config.nodeconfig import read_node_file
from controller.store.sources.manifests import load

MANIFEST = """\
apiVersion: reconcile/v1
kind: Deployment
metadata:
  name: box
spec:
  engine: vllm
  model: org/model
  container:
{body}"""


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            "    image: Docker.io/Vllm:v1\n",
            "bad.yaml:9: spec.container.image: image 'Docker.io/Vllm:v1' is not an image reference",
            id="image-that-cannot-parse",
        ),
        pytest.param(
            "    image: vllm/vllm-openai@sha256:abc\n",
            "bad.yaml:9: spec.container.image: image 'vllm/vllm-openai@sha256:abc'",
            id="short-digest",
        ),
        pytest.param(
            "    volumes:\n      - /data:/data\n      - data/hf:/hf:ro\n",
            "bad.yaml:11: spec.container.volumes[1]: volume 'data/hf:/hf:ro': the host path "
            "'data/hf' must be absolute",
            id="relative-host-path",
        ),
        pytest.param(
            "    volumes: [/data]\n",
            "bad.yaml:9: spec.container.volumes[0]: volume '/data' is not host:container[:ro]",
            id="volume-without-container-path",
        ),
        pytest.param(
            "    volumes: ['/a:/b:rx']\n",
            "spec.container.volumes[0]: volume '/a:/b:rx' is not host:container[:ro]",
            id="volume-bad-mode",
        ),
        pytest.param(  # refused by `export` and by the runtimes at start, not at load
            "    volumes:\n      - /data:/x\n      - /other:/x/:ro\n",
            "bad.yaml:11: spec.container.volumes[1]: volume '/other:/x/:ro' mounts at /x, as "
            "volumes[0] does: podman and docker refuse two mounts at one container path when "
            "the engine starts; keep one, or mount this one elsewhere",
            id="two-volumes-at-one-path",
        ),
        pytest.param(
            "    runtime: lxc\n",
            "bad.yaml:9: spec.container.runtime: Input should be 'podman' or 'docker'",
            id="unknown-runtime",
        ),
        pytest.param(
            "    pullPolicy: Sometimes\n",
            "bad.yaml:9: spec.container.pullPolicy: Input should be 'Always', 'IfNotPresent' "
            "or 'Never'",
            id="unknown-pull-policy",
        ),
        pytest.param(
            "    shmSize: lots\n", "bad.yaml:9: spec.container.shmSize:", id="bad-shm-size"
        ),
        pytest.param(  # it said to leave the size out "for a whole device": devices.memory's
            "    shmSize: 0\n",
            "bad.yaml:9: spec.container.shmSize: shmSize 0 is zero: /dev/shm is at least 1 "
            "byte (leave shmSize out for the runtime's default, 64Mi)",
            id="zero-shm-size",
        ),
        pytest.param("    imag: x\n", "bad.yaml:9: spec.container.imag", id="unknown-field"),
    ],
)
def test_a_bad_container_names_file_line_and_field(
    tmp_path: Path, body: str, expected: str
) -> None:
    (tmp_path / "bad.yaml").write_text(MANIFEST.format(body=body))
    result = load([tmp_path])
    assert not result.entries
    [message] = [str(e) for e in result.errors]
    assert expected in message, message


def test_a_stored_spec_with_two_volumes_at_one_path_still_loads() -> None:
    """The loader refuses it, the model does not: a record an older version wrote (its
    stored spec) must still load, or its engine would be forgotten."""
    container = Container.model_validate({"volumes": ["/data:/x", "/other:/x:ro"]})
    assert container.volumes == ("/data:/x", "/other:/x:ro")


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("vllm/vllm-openai:v0.11.0", "IfNotPresent"),
        ("vllm/vllm-openai:latest", "Always"),
        ("vllm/vllm-openai", "Always"),
        ("localhost:5000/engine", "Always"),
        ("localhost:5000/engine:1", "IfNotPresent"),
        ("localhost:5000/engine@sha256:" + "a" * 64, "IfNotPresent"),
    ],
)
def test_the_pull_policy_defaults_as_kubernetes(image: str, policy: str) -> None:
    assert Container(image=image).policy(image) == policy
    assert Container(image=image, pull_policy="Never").policy(image) == "Never"


def test_an_empty_container_runs_the_recipes_pinned_image_and_its_program() -> None:
    dep = deployment("box", engine="llama-cpp", command=None, model="/m/x.gguf", container={})
    assert image_of(dep.spec) == llama_cpp.IMAGE
    gpu = deployment(
        "g", engine="llama-cpp", command=None, model="/m/x.gguf", container={}, devices={"count": 1}
    )
    assert image_of(gpu.spec) == llama_cpp.IMAGE_CUDA
    rendered = render(
        entry("box", engine="llama-cpp", command=None, model="/m/x.gguf", container={}),
        devices=(),
        port=9000,
        extra_ports=(9001,),
    )
    assert rendered.argv[0] == llama_cpp.IMAGE_EXECUTABLE
    # vllm's image has `vllm` on its PATH: the recipe's usual program.
    plain = render(
        entry("v", engine="vllm", command=None, model="org/m", container={}),
        devices=(),
        port=9000,
        extra_ports=(9001,),
    )
    assert plain.argv[0] == "vllm"
    assert (
        image_of(deployment("v", engine="vllm", command=None, model="o/m", container={}).spec)
        == vllm.IMAGE
    )
    # A process keeps the recipe's program name, found on PATH.
    bare = render(
        entry("p", engine="llama-cpp", command=None, model="/m/x.gguf"), devices=(), port=9000
    )
    assert bare.argv[0] != llama_cpp.IMAGE_EXECUTABLE


def test_export_uses_the_containers_image() -> None:
    image = "registry.example/team/vllm:v0.11.0-patched"
    dep = deployment("v", engine="vllm", command=None, model="o/m", container={"image": image})
    pods = [o for o in export(dep).objects if o["kind"] == "Deployment"]
    assert pods[0]["spec"]["template"]["spec"]["containers"][0]["image"] == image


def test_spec_image_is_exports_alone_never_what_a_container_runs(tmp_path: Path) -> None:
    """spec.image is outside the spec hash (an edit restarts nothing), so a container that
    ran it would run another image than its manifest says after any restart: it runs
    `container.image`, else the recipe's pinned one; export's pod still takes spec.image."""
    other = "registry.example/team/vllm:patched"
    dep = deployment("v", engine="vllm", command=None, model="o/m", container={}, image=other)
    assert container_image(dep.spec) == vllm.IMAGE
    assert image_of(dep.spec) == other
    edited = deployment("v", engine="vllm", command=None, model="o/m", container={})
    assert spec_hash(edited.spec) == spec_hash(dep.spec)  # why it must not run
    (tmp_path / "cmd.yaml").write_text(
        "apiVersion: reconcile/v1\nkind: Deployment\nmetadata:\n  name: cmd\nspec:\n"
        "  engine: command\n"
        f"  command: [/bin/engine, '{{port}}']\n  image: {other}\n  container: {{}}\n"
    )
    [error] = load([tmp_path]).errors
    assert "set spec.container.image" in str(error), error
    assert "spec.image is for `reconcile export` only" in str(error), error


def test_a_spec_without_container_keeps_its_hash_and_a_container_changes_it() -> None:
    plain = deployment("v", engine="vllm", command=None, model="o/m")
    boxed = deployment("v", engine="vllm", command=None, model="o/m", container={})
    assert "container" not in plain.spec.model_dump(by_alias=True, exclude_none=True)
    assert spec_hash(plain.spec) != spec_hash(boxed.spec)  # wrapping it is a restart


def test_the_node_default_runtime(tmp_path: Path) -> None:
    (tmp_path / "node.yaml").write_text("containerRuntime: docker\n")
    assert read_node_file(None, tmp_path).container_runtime == "docker"
    assert default_runtime("docker") == "docker"
    (tmp_path / "node.yaml").write_text("maxInstances: 2\ncontainerRuntime: lxc\n")
    with pytest.raises(ConfigError, match=r"node.yaml:2: containerRuntime: Input should be"):
        read_node_file(None, tmp_path)


def test_static_devices_pass_no_gpu_but_the_visibility_variable() -> None:
    from controller.backends.local.container import Passed, container_env

    rendered = render(
        entry("g", engine="vllm", command=None, model="o/m", container={}, devices={"count": 1}),
        devices=(Device(kind="nvidia", id="3"),),
        port=9000,
        extra_ports=(9001,),
    )
    assert container_env(rendered.env, None)["CUDA_VISIBLE_DEVICES"] == "3"
    # Passed into the container (a real inventory), the device is the container's first.
    passed = Passed.of(("nvidia:3",))
    assert container_env(rendered.env, passed)["CUDA_VISIBLE_DEVICES"] == "0"


@pytest.mark.parametrize(
    ("said", "shown"),
    [
        # podman's log line (logrus' text format) while a pull retries: its msg alone
        (
            'time="2026-12-06T01:56:26Z" level=warning msg="Failed, retrying in 1s ... '
            '(1/3). Error: pinging container registry \\"x\\": refused"',
            'Failed, retrying in 1s ... (1/3). Error: pinging container registry "x": refused',
        ),
        (
            "Error: initializing source docker://x: refused\n",
            "initializing source docker://x: refused",
        ),
        (
            "docker: Error response from daemon: no such image.\nRun 'docker run --help' for more",
            "no such image.",
        ),
        ("", "failed (no message)"),
    ],
)
def test_the_runtimes_words_are_its_message_alone(said: str, shown: str) -> None:
    from controller.host.containers import words

    assert words(said) == shown
