"""`reconcile export`'s pure conversion: every shipped example becomes objects that the
Kubernetes OpenAPI schema accepts (strict: no unknown field), goldens pin two recipes,
and specs with no faithful form are refused (or dropped with --lossy).
"""

from __future__ import annotations

import http.server
import math
import os
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubelet_expand import container_argv, container_env
from kubernetes_validate import utils as kv_utils
from strategies import deployment

from controller.core.engines import llama_cpp, ollama, sglang, tgi, vllm
from controller.core.kubernetes.export import Exported, ExportError, export, problems_of
from controller.core.manifest.specs import Deployment
from controller.store.sources.manifests import load

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "export"
FOLDERS = sorted(
    {p.parent for top in ("manifests", "examples") for p in (REPO / top).rglob("*.yaml")}
)
# The oldest and newest Kubernetes the installed kubernetes-validate knows, read at run time.
VERSIONS = sorted({kv_utils.all_versions()[0], kv_utils.all_versions()[-1]}, key=kv_utils.Version)
STAND_IN_IMAGE = "registry.example/reconcile-demo:1"


def shipped() -> list[Deployment]:
    """Every shipped deployment; each folder is a manifest set of its own (model names may
    repeat across examples, never within one)."""
    out = []
    for folder in FOLDERS:
        loaded = load([folder])
        assert not loaded.errors, loaded.errors
        out += [e.deployment for _, e in sorted(loaded.entries.items())]
    return out


SHIPPED = shipped()


def with_image(dep: Deployment) -> Deployment:
    """The demos run `python3 -m controller.demo.engine`: no public image holds it."""
    if dep.spec.image is not None or dep.spec.engine != "command":
        return dep
    return dep.model_copy(update={"spec": dep.spec.model_copy(update={"image": STAND_IN_IMAGE})})


def by_kind(exported: Exported) -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in exported.objects}


def container(exported: Exported) -> dict[str, Any]:
    workload = by_kind(exported).get("Deployment") or by_kind(exported)["Job"]
    containers: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_there_is_something_to_export() -> None:
    engines = {d.spec.engine for d in SHIPPED}
    assert engines == {"vllm", "llama-cpp", "sglang", "tgi", "ollama", "command"}
    assert len(VERSIONS) == 2, VERSIONS  # an oldest and a newest, not one version twice


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dep", SHIPPED, ids=lambda d: d.name)
def test_every_shipped_example_exports_to_valid_kubernetes(dep: Deployment, version: str) -> None:
    exported = export(with_image(dep), lossy=True, namespace="inference")
    assert [o["kind"] for o in exported.objects][-1] == "Service"
    for obj in exported.objects:
        # strict: an unknown or misspelt field fails, as `kubectl apply --validate=strict` would
        kubernetes_validate.validate(obj, version, strict=True)
        assert obj["metadata"]["namespace"] == "inference"
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == dep.name
        assert labels["app.kubernetes.io/managed-by"] == "reconcile"
        assert dep.metadata.labels.items() <= labels.items()


def test_the_validator_catches_a_broken_object() -> None:
    """Guard against a validator that accepts anything: the test above would mean nothing."""
    obj = by_kind(export(deployment("web", image=STAND_IN_IMAGE)))["Deployment"]
    obj["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)


# -- goldens ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["vllm", "llama-cpp"])
def test_golden(name: str) -> None:
    """Regenerate after an intended change:
    RECONCILE_UPDATE_GOLDEN=1 pytest tests/core/test_export.py"""
    doc = yaml.safe_load((REPO / "examples" / "engines" / f"{name}.yaml").read_text())
    objects = export(Deployment.model_validate(doc)).objects
    text = yaml.safe_dump_all(objects, sort_keys=False)
    golden = GOLDEN / f"{name}.yaml"
    if os.environ.get("RECONCILE_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


# -- the mapping, field by field --------------------------------------------------------


def test_a_vllm_deployment_maps_its_fields() -> None:
    dep = deployment(
        "llama",
        engine="vllm",
        command=None,
        model="org/model",
        args=["--max-model-len", "{port}"],
        env={"HF_HOME": "/data/hf"},
        devices={"count": 2, "kind": "nvidia"},
        port=9000,
        readiness={"deadlineSeconds": 601, "periodSeconds": 0.5},
        stopGracePeriodSeconds=12.5,
        strategy="RollingUpdate",
    )
    exported = export(dep)
    workload, service = by_kind(exported)["Deployment"], by_kind(exported)["Service"]
    assert workload["spec"]["replicas"] == 1
    assert workload["spec"]["strategy"]["type"] == "RollingUpdate"
    assert workload["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = workload["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Always"
    assert pod["terminationGracePeriodSeconds"] == 13  # whole seconds, never shorter
    c = container(exported)
    assert c["image"] == vllm.IMAGE
    assert c["command"] == ["vllm"]
    assert c["args"][:5] == ["serve", "org/model", "--host", "0.0.0.0", "--port"]
    assert c["args"][5:] == ["9000", "--tensor-parallel-size", "2", "--max-model-len", "9000"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["HF_HOME"] == "/data/hf" and env["PORT"] == "9000"
    assert env["VLLM_PORT"] not in ("9000", "")
    assert "CUDA_VISIBLE_DEVICES" not in env  # the device plugin decides in a pod
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    assert c["ports"] == [{"name": "http", "containerPort": 9000, "protocol": "TCP"}]
    ready, startup = c["readinessProbe"], c["startupProbe"]
    assert ready["httpGet"] == {"path": "/health", "port": "http"}
    assert ready["periodSeconds"] == 1 and startup["periodSeconds"] == 1
    assert startup["failureThreshold"] * startup["periodSeconds"] >= 601
    assert service["spec"]["ports"][0]["port"] == 9000
    assert service["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize(
    ("policy", "backoff"), [("OnFailure", 2**31 - 1), ("Never", 0)], ids=["on-failure", "never"]
)
def test_a_run_to_completion_becomes_a_job(policy: str, backoff: int) -> None:
    """OnFailure restarts a failed engine with back-off for as long as it fails, here and
    in the pod; the Job's default backoffLimit (6) marked it failed after 6 restarts."""
    exported = export(deployment("batch", image=STAND_IN_IMAGE, restartPolicy=policy))
    job = by_kind(exported)["Job"]
    assert job["apiVersion"] == "batch/v1" and "Deployment" not in by_kind(exported)
    assert job["spec"]["template"]["spec"]["restartPolicy"] == policy
    assert job["spec"].get("backoffLimit") == backoff
    kubernetes_validate.validate(job, VERSIONS[-1], strict=True)


def test_a_command_fills_placeholders_for_the_pod() -> None:
    dep = deployment(
        "files",
        command=["python3", "-m", "http.server", "{port}", "--bind", "{host}", "{name}"],
        image="python:3.12-slim",
        readiness={"tcpSocket": {}, "deadlineSeconds": 30, "periodSeconds": 1},
    )
    c = container(export(dep))
    assert c["command"] == ["python3"]
    assert c["args"] == ["-m", "http.server", "8000", "--bind", "0.0.0.0", "files"]
    assert c["image"] == "python:3.12-slim"
    assert c["startupProbe"] == {"tcpSocket": {"port": "http"}, "periodSeconds": 1,
                                 "failureThreshold": 30}  # fmt: skip
    # No GPU asked for: the fence that keeps it off any GPU still holds in a pod.
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": ""} in c["env"]
    assert "resources" not in c


# Locally an argv and an environment reach the engine as written; the kubelet expands
# `$(VAR)` (PORT is one of the pod's) and reads `$$` as `$`.
DOLLARS = ("$$", "$(PORT)", "$(date)", "${HOME}", "a$", "$(unclosed", "$$(PORT)", "$")


def test_dollars_reach_the_pods_program_as_written_not_as_the_kubelet_expands_them() -> None:
    command = ["sh", "-c", " ".join(DOLLARS), *DOLLARS]
    env = {"A": "1", "B": "$(A)", "C": "pa$$word", "D": "$(PORT)"}
    dep = deployment("dollars", command=command, env=env, image=STAND_IN_IMAGE)
    c = container(export(dep))
    assert container_argv(c) == command
    assert {k: container_env(c)[k] for k in env} == env
    kubernetes_validate.validate(by_kind(export(dep))["Deployment"], VERSIONS[-1], strict=True)


def test_without_a_probe_there_is_none() -> None:
    c = container(export(deployment("plain", image=STAND_IN_IMAGE)))
    assert "readinessProbe" not in c and "startupProbe" not in c


@pytest.mark.parametrize(
    ("engine", "image"),
    [("vllm", vllm.IMAGE), ("sglang", sglang.IMAGE), ("tgi", tgi.IMAGE), ("ollama", ollama.IMAGE)],
)
def test_recipes_use_their_pinned_image_unless_the_spec_names_one(engine: str, image: str) -> None:
    gpu = {"count": 1}  # the pinned images of these three are CUDA builds
    dep = deployment(
        "m", engine=engine, command=None, model="org/m", executable="/opt/x/bin", devices=gpu
    )
    c = container(export(dep))
    assert c["image"] == image and ":" in image and not image.endswith(":latest")
    assert c["command"][0] != "/opt/x/bin"  # a host path means nothing in the image
    named = deployment("m", engine=engine, command=None, model="org/m", image="acme/e:2")
    assert container(export(named))["image"] == "acme/e:2"


def test_llama_cpp_runs_the_images_server_and_its_cuda_build_on_a_gpu() -> None:
    cpu = deployment("g", engine="llama-cpp", command=None, model="/m.gguf")
    gpu = deployment("g", engine="llama-cpp", command=None, model="/m.gguf", devices={"count": 1})
    assert container(export(cpu))["image"] == llama_cpp.IMAGE
    assert container(export(cpu))["command"] == [llama_cpp.IMAGE_EXECUTABLE]
    assert container(export(cpu))["args"][-2:] == ["-ngl", "0"]
    assert container(export(gpu))["image"] == llama_cpp.IMAGE_CUDA
    assert container(export(gpu))["args"][-2:] == ["-ngl", "999"]
    assert container(export(gpu))["resources"] == {"limits": {"nvidia.com/gpu": 1}}


def test_amd_gpus_are_asked_for_by_their_resource() -> None:
    dep = deployment("r", image="rocm/engine:1", devices={"count": 1, "kind": "amd"})
    assert container(export(dep))["resources"] == {"limits": {"amd.com/gpu": 1}}


def test_a_deadline_is_covered_whole() -> None:
    dep = deployment("slow", image=STAND_IN_IMAGE,
                     readiness={"httpGet": {"path": "/ready"}, "deadlineSeconds": 1000,
                                "periodSeconds": 3})  # fmt: skip
    startup = container(export(dep))["startupProbe"]
    assert startup["httpGet"]["path"] == "/ready"
    assert startup["failureThreshold"] == math.ceil(1000 / 3)


# -- refusals -----------------------------------------------------------------------------


UNFAITHFUL = {
    "candidates": ({"count": 1, "kind": "nvidia", "candidates": ["1"]}, "spec.devices.candidates"),
    "shareable": ({"count": 1, "kind": "nvidia", "shareable": True}, "spec.devices.shareable"),
    "apple": ({"count": 1, "kind": "apple"}, "spec.devices.kind"),
}


@pytest.mark.parametrize("case", sorted(UNFAITHFUL))
def test_no_faithful_form_is_refused_unless_lossy(case: str) -> None:
    devices, field = UNFAITHFUL[case]
    dep = deployment("gpu", image=STAND_IN_IMAGE, devices=devices)
    with pytest.raises(ExportError) as info:
        export(dep)
    (problem,) = info.value.problems
    assert ".".join(problem.field) == field and problem.droppable
    assert "no Kubernetes form" in problem.message
    lossy = export(dep, lossy=True)
    assert [".".join(p.field) for p in lossy.dropped] == [field]
    for obj in lossy.objects:
        kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)
    limits = container(lossy).get("resources", {}).get("limits", {})
    assert limits == ({} if case == "apple" else {"nvidia.com/gpu": 1})


def test_cpu_devices_are_refused_unless_lossy_which_drops_them() -> None:
    """A cpu device is a slot of the node's inventory, not a count of cores: the export
    dropped it without a word (and vLLM's pod still split the model over two GPUs it
    never asked for)."""
    dep = deployment("cpu", engine="vllm", command=None, model="org/m", image="acme/vllm-cpu:1",
                     devices={"count": 2, "kind": "cpu"})  # fmt: skip
    with pytest.raises(ExportError) as info:
        export(dep)
    (problem,) = info.value.problems
    assert problem.field == ("spec", "devices", "count") and problem.droppable
    assert "not a number of cores" in problem.message and problem.fix == "set it to 0"
    lossy = export(dep, lossy=True)
    assert [p.field for p in lossy.dropped] == [("spec", "devices", "count")]
    _valid_everywhere(lossy)
    box = container(lossy)
    assert "resources" not in box and "--tensor-parallel-size" not in box["args"]
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": ""} in box["env"]  # as at count 0


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi"])
def test_a_cuda_image_with_no_gpu_is_refused_unless_lossy(engine: str) -> None:
    """At devices.count 0 these exported their pinned CUDA image with no GPU request: a
    pod that cannot start. Refused (the user names an image, or GPUs); --lossy exports it
    as asked; a GPU, or an image of the user's, is no problem."""
    dep = deployment("cpu", engine=engine, command=None, model="org/m")
    with pytest.raises(ExportError) as info:
        export(dep)
    (problem,) = info.value.problems
    assert problem.field == ("spec", "image") and problem.droppable
    assert "is a CUDA build" in problem.message and "spec.devices.count is 0" in problem.message
    assert "set spec.image" in problem.fix
    lossy = export(dep, lossy=True)
    assert [p.field for p in lossy.dropped] == [("spec", "image")]
    assert "resources" not in container(lossy)
    _valid_everywhere(lossy)
    for fine in ({"devices": {"count": 1}}, {"image": "acme/engine-cpu:1"}):
        assert (
            problems_of(deployment("ok", engine=engine, command=None, model="m", **fine).spec) == []
        )
    on_cpu = deployment("cpu", engine=engine, command=None, model="m", image="acme/e:1",
                        devices={"count": 1, "kind": "cpu"})  # fmt: skip
    assert [p.field for p in problems_of(on_cpu.spec)] == [("spec", "devices", "count")]


def test_engines_whose_image_runs_without_a_gpu_export_at_count_zero() -> None:
    assert export(deployment("o", engine="ollama", command=None)).dropped == ()
    gguf = deployment("g", engine="llama-cpp", command=None, model="/m.gguf")
    assert container(export(gguf))["image"] == llama_cpp.IMAGE


def test_a_liveness_probe_is_exported_as_kubernetes_means_it() -> None:
    live = {"httpGet": {"path": "/live"}, "periodSeconds": 2.5, "timeoutSeconds": 0.5}
    probe = container(export(deployment("alive", image=STAND_IN_IMAGE, livenessProbe=live)))
    assert probe["livenessProbe"] == {
        "httpGet": {"path": "/live", "port": "http"},
        "periodSeconds": 3,
        "timeoutSeconds": 1,
        "failureThreshold": 3,
    }


class KeyedEngine(http.server.BaseHTTPRequestHandler):
    """vLLM's rule: /v1/... answers 401 without the API key."""

    def do_GET(self) -> None:
        keyed = self.path.startswith("/v1/")
        allowed = not keyed or self.headers.get("Authorization") == "Bearer sk-test"
        self.send_response(200 if allowed else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def kubelet_probe(port: int, probe: dict[str, Any]) -> int:
    """What the kubelet's httpGet check does: GET the path with the probe's headers."""
    get = probe["httpGet"]
    headers = {h["name"]: h["value"] for h in get.get("httpHeaders", [])}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{get['path']}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            status: int = answer.status
    except urllib.error.HTTPError as refused:
        status = refused.code
    return status


@pytest.mark.parametrize(
    "key", [{"args": ["--api-key", "sk-test"]}, {"env": {"VLLM_API_KEY": "sk-test"}}]
)
def test_a_probe_of_an_engine_with_an_api_key_presents_it_as_ours_do(key: dict[str, Any]) -> None:
    """A probe path behind the key (/v1/models) answered the pod's probes 401 (reconcile's
    present the key): the pod was never Ready, and its startupProbe restarted it."""
    probes = {"readiness": {"httpGet": {"path": "/v1/models"}},
              "livenessProbe": {"httpGet": {"path": "/v1/models"}}}  # fmt: skip
    dep = deployment("keyed", engine="vllm", command=None, model="m/x", devices={"count": 1},
                     **probes, **key)  # fmt: skip
    exported = export(dep)
    box = container(exported)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), KeyedEngine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        for name in ("readinessProbe", "startupProbe", "livenessProbe"):
            assert kubelet_probe(server.server_address[1], box[name]) == 200, name
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=60)
    kubernetes_validate.validate(by_kind(exported)["Deployment"], VERSIONS[-1], strict=True)
    keyless = container(export(deployment("open", engine="vllm", command=None, model="m/x",
                                          devices={"count": 1}, **probes)))  # fmt: skip
    assert "httpHeaders" not in keyless["readinessProbe"]["httpGet"]


def test_a_probe_behind_a_key_the_pod_reads_from_a_secret_is_said() -> None:
    """A key in the envFrom Secret is not the export's to copy into a probe: it says so."""
    secret = {"envFrom": [{"file": "/etc/reconcile/vllm.env"}]}
    spec = {"engine": "vllm", "command": None, "model": "m/x", "devices": {"count": 1}}
    guarded = deployment("web", readiness={"httpGet": {"path": "/v1/models"}}, **spec, **secret)
    notes = [n.message for n in export(guarded).notes if "VLLM_API_KEY" in n.message]
    assert len(notes) == 1 and "GET /v1/models" in notes[0] and "(/health)" in notes[0]
    for quiet in (deployment("web", **spec, **secret), deployment("web", **spec)):
        assert not [n for n in export(quiet).notes if "VLLM_API_KEY" in n.message]


@pytest.mark.parametrize("where", ["readiness", "livenessProbe"])
def test_a_completion_probe_is_refused_unless_lossy(where: str) -> None:
    dep = deployment("asks", image=STAND_IN_IMAGE, **{where: {"completion": {}}})
    with pytest.raises(ExportError) as info:
        export(dep)
    (problem,) = info.value.problems
    assert problem.field == ("spec", where, "completion") and "cannot POST" in problem.message
    c = container(export(dep, lossy=True))
    assert "readinessProbe" not in c and "livenessProbe" not in c


def test_command_without_image_is_refused_even_when_lossy() -> None:
    dep = deployment("cmd")
    for lossy in (False, True):
        with pytest.raises(ExportError) as info:
            export(dep, lossy=lossy)
        (problem,) = info.value.problems
        assert problem.field == ("spec", "image") and not problem.droppable
        assert "set spec.image" in problem.message


def test_a_name_no_service_may_have_is_refused_even_when_lossy() -> None:
    """`7b-chat` is a valid deployment name, but its Service would be rejected by the API
    server (a DNS-1035 label starts with a letter), failing the whole `kubectl apply`;
    the schema check above never looks at names."""
    dep = deployment("7b-chat", image=STAND_IN_IMAGE)
    for lossy in (False, True):
        with pytest.raises(ExportError) as info:
            export(dep, lossy=lossy)
        (problem,) = info.value.problems
        assert problem.field == ("metadata", "name") and not problem.droppable
        assert "start with a letter" in problem.message and "m7b-chat" in problem.message
    assert export(deployment("chat-7b", image=STAND_IN_IMAGE)).objects


def test_a_service_that_would_be_the_api_servers_own_is_refused() -> None:
    """A deployment named kubernetes: its Service, applied in the namespace default, is the
    API server's own (kubectl apply gave it a selector and port 8000, and the pods' API
    went with it)."""
    dep = deployment("kubernetes", image=STAND_IN_IMAGE)
    for namespace in (None, "default"):
        with pytest.raises(ExportError) as info:
            export(dep, lossy=True, namespace=namespace)
        assert [p.field for p in info.value.problems] == [("metadata", "name")]
        assert "--namespace NS" in info.value.problems[0].message
    assert by_kind(export(dep, namespace="ml"))["Service"]["metadata"]["namespace"] == "ml"


def test_a_pod_the_api_server_would_reject_for_its_names_is_refused() -> None:
    """Schema-valid, rejected by the API server: two containers named alike (the engine
    named as the pull's initContainer), two mounts at one path (a bind mount at the
    pulled model's /models)."""
    source = {"url": "https://models.example.org/m.gguf", "sha256": "a" * 64}
    cases = {
        ("metadata", "name"): deployment("pull-model", image=STAND_IN_IMAGE, source=source),
        ("spec", "container", "volumes"): deployment(
            "web", source=source, container={"image": "x:1", "volumes": ["/data:/models:ro"]}
        ),
    }
    for field, dep in cases.items():
        with pytest.raises(ExportError) as info:
            export(dep, lossy=True)
        assert [p.field for p in info.value.problems] == [field]
    kept = deployment("web", source=source, container={"image": "x:1", "volumes": ["/d:/data"]})
    assert export(kept).objects


@pytest.mark.parametrize("version", VERSIONS)
def test_a_label_kubernetes_cannot_hold_is_refused_unless_lossy(version: str) -> None:
    """metadata.labels are free-form here; the API server refuses an object with a label
    outside Kubernetes' syntax (kubernetes-validate passes it), so `kubectl apply` of the
    export failed on every object of the deployment."""
    labels = {"team": "research", "owner": "alice@example.com", "Team Name": "x"}
    plain = deployment("web", image=STAND_IN_IMAGE)
    meta = plain.metadata.model_copy(update={"labels": labels})
    dep = plain.model_copy(update={"metadata": meta})
    with pytest.raises(ExportError) as info:
        export(dep)
    fields = [p.field for p in info.value.problems]
    assert fields == [("metadata", "labels", "owner"), ("metadata", "labels", "Team Name")]
    assert "'alice@example.com'" in info.value.problems[0].message
    exported = export(dep, lossy=True)
    assert [p.field for p in exported.dropped] == fields
    for obj in exported.objects:
        kubernetes_validate.validate(obj, version, strict=True)
        assert obj["metadata"]["labels"] == {
            "team": "research",
            "app.kubernetes.io/name": "web",
            "app.kubernetes.io/managed-by": "reconcile",
        }
    pod_labels = by_kind(exported)["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert "owner" not in pod_labels and "Team Name" not in pod_labels


def test_a_label_the_export_sets_itself_is_refused_unless_lossy_not_overwritten() -> None:
    """app.kubernetes.io/name and managed-by are the selector's: a user's other value was
    replaced without a word (`managed-by: argocd` gone from every object)."""
    labels = {
        "app.kubernetes.io/name": "chat",
        "app.kubernetes.io/managed-by": "argocd",
        "app.kubernetes.io/instance": "prod",
    }
    plain = deployment("web", image=STAND_IN_IMAGE)
    dep = plain.model_copy(
        update={"metadata": plain.metadata.model_copy(update={"labels": labels})}
    )
    with pytest.raises(ExportError) as info:
        export(dep)
    fields = [p.field for p in info.value.problems]
    assert fields == [("metadata", "labels", k) for k in list(labels)[:2]]
    assert "'argocd'" in info.value.problems[1].message
    exported = export(dep, lossy=True)
    assert [p.field for p in exported.dropped] == fields
    assert by_kind(exported)["Service"]["metadata"]["labels"] == {
        "app.kubernetes.io/instance": "prod",
        "app.kubernetes.io/name": "web",
        "app.kubernetes.io/managed-by": "reconcile",
    }
    same = {"app.kubernetes.io/name": "web", "app.kubernetes.io/managed-by": "reconcile"}
    agreeing = plain.model_copy(
        update={"metadata": plain.metadata.model_copy(update={"labels": same})}
    )
    assert export(agreeing).dropped == ()


def test_amd_without_an_image_is_refused() -> None:
    dep = deployment(
        "r", engine="vllm", command=None, model="m", devices={"count": 1, "kind": "amd"}
    )
    assert [p.field for p in problems_of(dep.spec)] == [("spec", "image")]


def test_a_faithful_spec_has_no_problems() -> None:
    assert problems_of(deployment("ok", image=STAND_IN_IMAGE, devices={"count": 1}).spec) == []


# -- replicas, autoscale, affinity, rollingUpdate (issue 21) -----------------------------

SCALED = {
    "engine": "vllm",
    "command": None,
    "model": "org/m",
    "devices": {"count": 1, "kind": "nvidia"},
    "basePort": 8000,
    "strategy": "RollingUpdate",
    "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1},
}
AUTOSCALE = {"min": 2, "max": 6, "targetInflight": 2.5, "scaleDownDelay": "10m"}


def _valid_everywhere(exported: Exported) -> None:
    for version in VERSIONS:
        for obj in exported.objects:
            kubernetes_validate.validate(obj, version, strict=True)


def test_replicas_and_rolling_update_land_on_the_deployment() -> None:
    exported = export(deployment("llm", replicas=3, **SCALED))
    _valid_everywhere(exported)
    spec = by_kind(exported)["Deployment"]["spec"]
    assert spec["replicas"] == 3
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1},
    }
    assert [o["kind"] for o in exported.objects] == ["Deployment", "Service"]
    assert exported.notes == ()  # no autoscaler: nothing more to say
    zero = by_kind(export(deployment("llm", replicas=0, **SCALED)))["Deployment"]
    assert zero["spec"]["replicas"] == 0  # declared, nothing running: as here


def test_a_replicated_job_runs_its_pods_in_parallel() -> None:
    exported = export(deployment("batch", image=STAND_IN_IMAGE, restartPolicy="Never", replicas=3))
    job = by_kind(exported)["Job"]["spec"]
    assert (job["parallelism"], job["completions"]) == (3, 3)
    _valid_everywhere(exported)


def test_autoscale_becomes_a_horizontal_pod_autoscaler_on_inflight() -> None:
    exported = export(deployment("llm", autoscale=AUTOSCALE, **SCALED), namespace="ml")
    _valid_everywhere(exported)
    kinds = [o["kind"] for o in exported.objects]
    assert kinds == ["Deployment", "HorizontalPodAutoscaler", "Service"]
    workload, hpa = by_kind(exported)["Deployment"], by_kind(exported)["HorizontalPodAutoscaler"]
    assert "replicas" not in workload["spec"]  # the HPA owns the count; apply must not reset it
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["metadata"]["namespace"] == "ml"
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 6)
    (metric,) = spec["metrics"]
    assert metric == {
        "type": "Pods",
        "pods": {
            "metric": {"name": "reconcile_gateway_inflight"},
            "target": {"type": "AverageValue", "averageValue": "2500m"},
        },
    }
    assert spec["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 600}}
    (note,) = exported.notes
    assert note.field == ("spec", "autoscale") and "metrics adapter" in note.message


def test_the_hpa_aims_at_the_target_the_autoscaler_here_takes() -> None:
    """`target` is inflight's aim when written (Autoscale.target_of); the HPA took the
    default targetInflight (4) instead, and scaled at another load than reconcile does."""
    aims = {}
    for scale in ({"target": 3}, {"targetInflight": 1.5}, {"metric": "waiting", "target": 9}):
        dep = deployment("llm", autoscale={"min": 1, "max": 4, **scale}, **SCALED)
        hpa = by_kind(export(dep, lossy=True))["HorizontalPodAutoscaler"]
        aims[tuple(scale)] = hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"]
    # waiting's target is not inflight's: --lossy exports inflight at its own default (4)
    assert aims == {("target",): "3", ("targetInflight",): "1500m", ("metric", "target"): "4"}


def test_autoscale_to_zero_is_refused_unless_lossy_which_exports_min_one() -> None:
    dep = deployment("llm", autoscale={**AUTOSCALE, "min": 0}, **SCALED)
    with pytest.raises(ExportError) as refused:
        export(dep)
    (problem,) = refused.value.problems
    assert problem.field == ("spec", "autoscale", "min") and problem.droppable
    assert "never scales below 1" in problem.message
    exported = export(dep, lossy=True)
    assert by_kind(exported)["HorizontalPodAutoscaler"]["spec"]["minReplicas"] == 1
    assert [p.field for p in exported.dropped] == [("spec", "autoscale", "min")]
    _valid_everywhere(exported)


def test_on_demand_is_refused_unless_lossy_which_exports_a_pod_that_always_runs() -> None:
    """OnDemand was exported as a Deployment of 1 without a word: a pod that holds its
    GPU all day, where the manifest said to start on a request and stop when idle."""
    dep = deployment("llm", activation="OnDemand", idleTimeout="5m", image=STAND_IN_IMAGE)
    with pytest.raises(ExportError) as refused:
        export(dep)
    (problem,) = refused.value.problems
    assert problem.field == ("spec", "activation") and problem.droppable
    assert "runs whether or not a request comes" in problem.message
    assert problem.fix == "set activation: Always"
    exported = export(dep, lossy=True)
    assert by_kind(exported)["Deployment"]["spec"]["replicas"] == 1
    assert [p.field for p in exported.dropped] == [("spec", "activation")]
    _valid_everywhere(exported)
    assert problems_of(deployment("llm", activation="Always", image=STAND_IN_IMAGE).spec) == []


def test_a_scale_down_delay_past_an_hour_is_refused_unless_lossy() -> None:
    dep = deployment("llm", autoscale={**AUTOSCALE, "scaleDownDelay": "2h"}, **SCALED)
    assert [p.field[-1] for p in problems_of(dep.spec)] == ["scaleDownDelay"]
    hpa = by_kind(export(dep, lossy=True))["HorizontalPodAutoscaler"]
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 3600


def test_an_engine_metric_is_refused_unless_lossy() -> None:
    spec = {"min": 2, "max": 6, "metric": "waiting", "target": 2}
    dep = deployment("llm", autoscale=spec, **SCALED)
    assert [p.field[-1] for p in problems_of(dep.spec)] == ["metric"]
    exported = export(dep, lossy=True)
    assert [p.field for p in exported.dropped] == [("spec", "autoscale", "metric")]
    assert "HorizontalPodAutoscaler" in by_kind(exported)


def test_a_job_has_no_autoscaler() -> None:
    dep = deployment("batch", image=STAND_IN_IMAGE, restartPolicy="OnFailure", autoscale=AUTOSCALE)
    assert [p.field for p in problems_of(dep.spec)] == [("spec", "autoscale")]
    assert [o["kind"] for o in export(dep, lossy=True).objects] == ["Job", "Service"]


@pytest.mark.parametrize("policy", ["OnFailure", "Never"])
def test_a_jobs_rolling_update_is_refused_unless_lossy_not_dropped_silently(policy: str) -> None:
    rolling = {"strategy": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    dep = deployment("batch", image=STAND_IN_IMAGE, restartPolicy=policy, **rolling)
    with pytest.raises(ExportError) as info:
        export(dep)
    assert [p.field for p in info.value.problems] == [("spec", "strategy")]
    assert "a Job has no update strategy" in info.value.problems[0].message
    job = by_kind(export(dep, lossy=True))["Job"]
    assert "strategy" not in job["spec"]
    kubernetes_validate.validate(job, VERSIONS[-1], strict=True)


def test_session_affinity_has_no_faithful_form() -> None:
    """Kubernetes' only Service affinity is ClientIP: behind an ingress one address for all."""
    dep = deployment("llm", replicas=2, affinity="session", **SCALED)
    with pytest.raises(ExportError) as refused:
        export(dep)
    assert [p.field for p in refused.value.problems] == [("spec", "affinity")]
    assert "x-session-id" in refused.value.problems[0].message
    service = by_kind(export(dep, lossy=True))["Service"]
    assert "sessionAffinity" not in service["spec"]


def test_prefix_affinity_is_said_when_written_and_silent_as_a_default() -> None:
    """A Service knows no prompt: a written ``affinity: prefix`` is refused (dropped with
    --lossy); left to the engine's default it is the gateway's own and exports quietly."""
    dep = deployment("llm", replicas=2, affinity="prefix", **SCALED)
    with pytest.raises(ExportError) as refused:
        export(dep)
    assert [p.field for p in refused.value.problems] == [("spec", "affinity")]
    assert "prefix" in refused.value.problems[0].message
    assert [o["kind"] for o in export(dep, lossy=True).objects] == ["Deployment", "Service"]
    assert problems_of(deployment("llm", replicas=2, **SCALED).spec) == []


def test_golden_autoscaled() -> None:
    """A replicated, autoscaled vLLM as the cluster gets it (regenerate as test_golden)."""
    dep = deployment("llm", autoscale=AUTOSCALE, **SCALED)
    text = yaml.safe_dump_all(export(dep).objects, sort_keys=False)
    golden = GOLDEN / "autoscaled.yaml"
    if os.environ.get("RECONCILE_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.parametrize("version", VERSIONS)
def test_env_from_becomes_a_secret_ref_and_a_note(version: str) -> None:
    dep = deployment(
        "web",
        engine="vllm",
        command=None,
        model="org/model",
        devices={"count": 1},
        env={"HF_HOME": "/data/hf"},
        envFrom=[{"file": "/etc/reconcile/hf.env"}, {"sopsFile": "secrets/api.env"}],
    )
    exported = export(dep)
    box = container(exported)
    assert box["envFrom"] == [{"secretRef": {"name": "web-env"}}]
    assert all(item["name"] != "HF_TOKEN" for item in box["env"])  # no value leaves the node
    (note,) = [n for n in exported.notes if n.field == ("spec", "envFrom")]
    assert "web-env" in note.message and "--from-env-file=/etc/reconcile/hf.env" in note.message
    assert "sops -d --input-type dotenv --output-type dotenv secrets/api.env" in note.message
    for obj in exported.objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_secrets_hint_is_kubectls_from_the_files_and_says_its_dialect() -> None:
    """The hint makes the Secret from the same files with `kubectl create secret generic
    --from-env-file` (a sopsFile through a pipe, named from the manifest's folder so it
    runs from any directory, with the types reconcile gives sops): no value on a command
    line or in a clear file. kubectl refuses the `export KEY=` lines reconcile's dotenv
    takes and keeps quotes in a value: the hint says so, so the first try is not a
    refusal that sends the user to `--from-literal` (the shell's history). A gated
    repo's token is in those files, and the download reads it from the same Secret."""
    dep = deployment(
        "web",
        engine="vllm",
        command=None,
        model="org/model",
        source={"huggingFace": {"repo": "org/model"}},
        devices={"count": 1},
        envFrom=[{"file": "/etc/reconcile/hf env"}, {"sopsFile": "secrets/api.env"}],
    )
    exported = export(dep, folder="/srv/manifests")
    notes = {n.field: n.message for n in exported.notes}
    hint = notes[("spec", "envFrom")]
    command = (
        "`kubectl create secret generic web-env --from-env-file='/etc/reconcile/hf env' "
        "--from-env-file=<(sops -d --input-type dotenv --output-type dotenv "
        "/srv/manifests/secrets/api.env)`"
    )
    assert command in hint, hint
    assert "a line starting with `export` is refused, quotes stay in the value" in hint
    assert "--from-literal" not in hint and "export " not in hint.replace("`export`", "")
    token = notes[("spec", "source")]
    assert "reads the Secret web-env as the engine does" in token, token
    plain = export(dep.model_copy(update={"spec": dep.spec.model_copy(update={"env_from": ()})}))
    token = {n.field: n.message for n in plain.notes}[("spec", "source")]
    assert "`kubectl create secret generic hf-token --from-file=token=FILE`" in token, token
    assert "never on the command line" in token


def test_each_secrets_hint_creates_it_in_the_namespace_the_pod_is_exported_to() -> None:
    """With --namespace the pod reads its Secrets there: a hint without it made them in
    kubectl's default namespace, and the pod stayed in CreateContainerConfigError."""
    url = "https://user:pw@models.example.org/m.gguf"
    keyed = {"url": url, "sha256": "a" * 64}
    hub = {"huggingFace": {"repo": "org/model"}}
    deps = [
        deployment("web", image=STAND_IN_IMAGE, envFrom=[{"file": "/etc/x.env"}]),
        deployment("pull", image=STAND_IN_IMAGE, source=keyed),
        deployment("hub", image=STAND_IN_IMAGE, source=hub),
    ]
    hints = []
    for dep in deps:
        for note in export(dep, namespace="llm").notes:
            hints += re.findall(r"`(kubectl create secret[^`]*)`", note.message)
    assert [h.split()[4:7] for h in hints] == [
        ["--namespace", "llm", "web-env"],
        ["--namespace", "llm", "pull-source"],
        ["--namespace", "llm", "hf-token"],
    ]
    for dep in deps:  # no --namespace: kubectl's context namespace, where the objects go
        assert "--namespace" not in " ".join(n.message for n in export(dep).notes)


def test_a_node_selector_becomes_the_pods() -> None:
    """Kubernetes' nodeSelector has the same meaning: every pair a label of the node."""
    selector = {"gpu": "h100", "example.com/site": "lab2"}
    exported = export(deployment("web", image=STAND_IN_IMAGE, nodeSelector=selector))
    _valid_everywhere(exported)
    pod = by_kind(exported)["Deployment"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == selector
    assert exported.dropped == () and exported.notes == ()
    plain = by_kind(export(deployment("web", image=STAND_IN_IMAGE)))["Deployment"]
    assert "nodeSelector" not in plain["spec"]["template"]["spec"]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_containers_pull_policy_shm_and_volumes_carry_over(version: str) -> None:
    """What the node's runtime is told, the pod is told: the pull policy in the same words,
    /dev/shm at its size, each bind mount as a hostPath (read-only where it was), and a
    note that a hostPath is the node's own folder."""
    box = {
        "image": "vllm/vllm-openai:v0.11.0",
        "pullPolicy": "Never",
        "shmSize": "16Gi",
        "volumes": ["/data/hf:/root/.cache/huggingface:ro", "/scratch:/scratch"],
    }
    exported = export(deployment("web", engine="vllm", command=None, model="m", container=box))
    for obj in exported.objects:
        kubernetes_validate.validate(obj, version, strict=True)
    pod = by_kind(exported)["Deployment"]["spec"]["template"]["spec"]
    engine = container(exported)
    assert engine["imagePullPolicy"] == "Never" and engine["image"] == box["image"]
    assert pod["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
        {"name": "host-0", "hostPath": {"path": "/data/hf"}},
        {"name": "host-1", "hostPath": {"path": "/scratch"}},
    ]
    assert engine["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "host-0", "mountPath": "/root/.cache/huggingface", "readOnly": True},
        {"name": "host-1", "mountPath": "/scratch"},
    ]
    (note,) = [n for n in exported.notes if n.field == ("spec", "container", "volumes")]
    assert "hostPath" in note.message and "/data/hf, /scratch" in note.message
    assert "PersistentVolumeClaim" in note.message


def test_a_container_without_those_fields_leaves_kubernetes_defaults() -> None:
    """No pullPolicy: Kubernetes' default is the node's (Always for :latest, else
    IfNotPresent); no shmSize and no GPU: no /dev/shm volume; an odd size stays exact."""
    cpu = {"engine": "vllm", "command": None, "model": "m", "image": STAND_IN_IMAGE}
    plain = export(deployment("web", **cpu, container={}))
    engine = container(plain)
    assert "imagePullPolicy" not in engine and "volumeMounts" not in engine
    assert "volumes" not in by_kind(plain)["Deployment"]["spec"]["template"]["spec"]
    assert plain.notes == ()
    odd = {"shmSize": "1500Mi"}
    pod = by_kind(export(deployment("web", **cpu, container=odd)))
    (shm,) = pod["Deployment"]["spec"]["template"]["spec"]["volumes"]
    assert shm["emptyDir"]["sizeLimit"] == "1500Mi"
    odder = {"shmSize": "10000001"}
    pod = by_kind(export(deployment("web", **cpu, container=odder)))
    (shm,) = pod["Deployment"]["spec"]["template"]["spec"]["volumes"]
    assert shm["emptyDir"]["sizeLimit"] == "10000001"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_bind_mount_at_dev_shm_is_the_pods_dev_shm(version: str) -> None:
    """A GPU (or shmSize) gave the pod a memory /dev/shm beside the user's bind mount at
    /dev/shm: two mounts at one path, which the API server refuses (the schema allows it).
    The bind is the /dev/shm, as it is in the local container; `/x/` is `/x`."""
    box = {"image": "x:1", "volumes": ["/dev/shm:/dev/shm/"], "shmSize": "1Gi"}
    dep = deployment("web", container=box, devices={"count": 1, "kind": "nvidia"})
    exported = export(dep)
    for obj in exported.objects:
        kubernetes_validate.validate(obj, version, strict=True)
    pod = by_kind(exported)["Deployment"]["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "host-0", "hostPath": {"path": "/dev/shm"}}]
    assert container(exported)["volumeMounts"] == [{"name": "host-0", "mountPath": "/dev/shm"}]


def test_two_volumes_at_one_container_path_are_refused() -> None:
    """`/a:/x` and `/b:/x/` exported as two mounts at one path: the API server refuses
    the pod (and podman and docker the container), so the export says so first."""
    dep = deployment("web", container={"image": "x:1", "volumes": ["/a:/x", "/b:/x/", "/c:/y"]})
    for lossy in (False, True):
        with pytest.raises(ExportError) as info:
            export(dep, lossy=lossy)
        (problem,) = info.value.problems
        assert problem.field == ("spec", "container", "volumes") and not problem.droppable
        assert "two volumes mount at /x" in problem.message


def test_a_host_path_with_dot_dot_is_refused() -> None:
    """podman and docker take `/data/../etc` (the kernel resolves it); the API server
    refuses a hostPath holding '..', and the whole pod with it."""
    dep = deployment("web", container={"image": "x:1", "volumes": ["/data/../etc:/etc2:ro"]})
    for lossy in (False, True):
        with pytest.raises(ExportError) as info:
            export(dep, lossy=lossy)
        (problem,) = info.value.problems
        assert problem.field == ("spec", "container", "volumes") and not problem.droppable
        assert "/data/../etc holds '..'" in problem.message
    fine = deployment("web", container={"image": "x:1", "volumes": ["/data/..etc:/etc2"]})
    assert container(export(fine))["volumeMounts"] == [{"name": "host-0", "mountPath": "/etc2"}]


def test_a_priority_becomes_a_priority_class_the_pod_names() -> None:
    """spec.priority was left out without a word: the exported pods all had the default
    priority, so the one the manifest ranked first preempted nothing. It is Kubernetes'
    own idea (a higher class preempts strictly lower ones when nodes run short)."""
    for priority, name in ((100, "reconcile-priority-100"), (-5, "reconcile-priority-minus-5")):
        exported = export(
            deployment("llm", priority=priority, image=STAND_IN_IMAGE), namespace="ml"
        )
        _valid_everywhere(exported)
        ranked = by_kind(exported)["PriorityClass"]
        assert ranked["metadata"]["name"] == name and "namespace" not in ranked["metadata"]
        assert ranked["value"] == priority
        assert ranked["preemptionPolicy"] == "PreemptLowerPriority"
        assert ranked["globalDefault"] is False
        pod = by_kind(exported)["Deployment"]["spec"]["template"]["spec"]
        assert pod["priorityClassName"] == name
        (note,) = exported.notes
        assert note.field == ("spec", "priority") and "cluster-wide" in note.message
    plain = export(deployment("llm", image=STAND_IN_IMAGE))
    assert [o["kind"] for o in plain.objects] == ["Deployment", "Service"]
    assert "priorityClassName" not in by_kind(plain)["Deployment"]["spec"]["template"]["spec"]


def test_a_spec_image_that_is_no_image_reference_is_refused_even_when_lossy() -> None:
    """spec.image is export's alone and was printed as written: a trailing space the API
    server refuses, an upper-case name the kubelet cannot pull. It is checked as
    container.image is, with the same hint; the container's image, when set, wins."""
    for image, said in (
        ("registry.example/app:1 ", "is not an image reference"),
        ("Docker.io/vllm/vllm-openai:v0.11.0", "docker.io/vllm/vllm-openai:v0.11.0"),
    ):
        dep = deployment("web", image=image)
        for lossy in (False, True):
            with pytest.raises(ExportError) as info:
                export(dep, lossy=lossy)
            (problem,) = info.value.problems
            assert problem.field == ("spec", "image") and not problem.droppable
            assert said in problem.message and "no pod can pull it" in problem.message
    shadowed = deployment("web", image="Bad Image", container={"image": STAND_IN_IMAGE})
    assert container(export(shadowed))["image"] == STAND_IN_IMAGE


def test_an_ollama_model_nothing_pulls_into_the_pod_is_said() -> None:
    """Here Ollama is Ready once /api/tags lists spec.model; the pod's probe GETs / only,
    and no pod pulls the model: it went Ready serving nothing, without a word."""
    exported = export(deployment("chat", engine="ollama", command=None, model="llama3.2"))
    probe = container(exported)["readinessProbe"]
    assert probe["httpGet"]["path"] == "/"
    (note,) = exported.notes
    assert note.field == ("spec", "model") and not note.droppable
    assert "llama3.2" in note.message and "OLLAMA_MODELS" in note.message
    assert export(deployment("chat", engine="ollama", command=None)).notes == ()


def test_a_model_path_no_volume_of_the_pod_holds_is_said() -> None:
    """A local container gets spec.model's folder mounted; the pod got nothing and its
    engine failed on a missing file, without a word from the export."""
    gguf = {"engine": "llama-cpp", "command": None, "model": "/srv/models/tiny.gguf"}
    (note,) = export(deployment("tiny", **gguf)).notes
    assert note.field == ("spec", "model") and "/srv/models/tiny.gguf" in note.message
    assert "no volume of the pod holds it" in note.message
    mounted = deployment("tiny", **gguf, container={"volumes": ["/srv/models:/srv/models:ro"]})
    assert [n.field for n in export(mounted).notes] == [("spec", "container", "volumes")]
    hub = deployment("hub", engine="vllm", command=None, model="org/m", devices={"count": 1})
    assert export(hub).notes == ()


@pytest.mark.parametrize(
    ("engine", "flag"), [("llama-cpp", "--api-key-file"), ("vllm", "--config")]
)
def test_a_file_the_args_name_on_this_node_is_said(engine: str, flag: str) -> None:
    """llama.cpp's key file and vLLM's flags file are read at the engine's start: a pod
    without them does not start, and nothing said so."""
    spec = {"engine": engine, "command": None, "model": "/srv/m", "devices": {"count": 1}}
    dep = deployment("web", args=[flag, "/etc/llm/file"], **spec)
    notes = [n for n in export(dep).notes if n.field == ("spec", "args")]
    assert len(notes) == 1 and f"{flag} /etc/llm/file" in notes[0].message
    mounted = {"image": "x:1", "volumes": ["/etc/llm:/etc/llm:ro", "/srv:/srv"]}
    held = deployment("web", args=[f"{flag}=/etc/llm/file"], container=mounted, **spec)
    assert not [n for n in export(held).notes if n.field == ("spec", "args")]


def test_a_spec_image_beside_a_container_image_is_said_not_ignored() -> None:
    """container.image is the pod's (as the node's); spec.image went unused silently."""
    spec = {"engine": "vllm", "command": None, "model": "m/x", "devices": {"count": 1}}
    local = {"image": "docker.io/vllm/vllm-openai:v0.10.0"}
    both = deployment("web", image="registry.example/vllm:1", container=local, **spec)
    exported = export(both)
    assert container(exported)["image"] == local["image"]
    (note,) = [n for n in exported.notes if n.field == ("spec", "image")]
    assert "registry.example/vllm:1" in note.message and local["image"] in note.message
    same = deployment("web", image=local["image"], container=local, **spec)
    assert not [n for n in export(same).notes if n.field == ("spec", "image")]


def test_a_containers_executable_is_the_pods_program_a_processs_is_not() -> None:
    """With `container: {}` the node runs spec.executable inside the pinned image, as the
    pod can; the export ran the image's default program instead. A process's executable
    is a host path: the pod runs the image's own."""
    spec = {"engine": "vllm", "command": None, "model": "m/x", "devices": {"count": 1}}
    inside = deployment("web", executable="/opt/venv/bin/vllm", container={}, **spec)
    assert container(export(inside))["command"] == ["/opt/venv/bin/vllm"]
    host = deployment("web", executable="/home/me/.venv/bin/vllm", **spec)
    assert container(export(host))["command"] == ["vllm"]


def test_aliases_the_gateway_routes_are_said_to_have_no_cluster_form() -> None:
    """Here a request for an alias reaches the deployment through the gateway; a
    Service has no such names: they were lost without a word."""
    hub = {"engine": "vllm", "command": None, "model": "org/m", "devices": {"count": 1}}
    (note,) = export(deployment("chat", **hub, aliases=["gpt-4o", "default"])).notes
    assert note.field == ("spec", "aliases") and not note.droppable
    assert "gpt-4o, default" in note.message and "gateway" in note.message
