"""Deployments as Kubernetes objects (DESIGN: "Export to Kubernetes"). Pure: plain dicts.

Each deployment becomes an ``apps/v1`` Deployment (``restartPolicy: Always``) or a
``batch/v1`` Job (``OnFailure``/``Never``), plus a ``v1`` Service for its port. The
container runs what the local backend would run: the recipe's argv from
:func:`~controller.core.render.render`, with ``{host}`` = 0.0.0.0 (a pod is reached
through its own address) and the pod's own ports.

A spec field that Kubernetes cannot express is an :class:`ExportGap`. Some can be dropped
(``--lossy``); others need the user (an image for ``engine: command``).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from controller.core.devices.inventory import Device
from controller.core.engines import image_program, llama_cpp, ollama, recipe_for, sglang, tgi, vllm
from controller.core.engines.apikey import ENV as KEY_VARIABLES
from controller.core.engines.apikey import api_key
from controller.core.engines.spelling import value_of
from controller.core.kubernetes import exportpull
from controller.core.kubernetes.kubelet import literal
from controller.core.manifest.labelsyntax import key_problem, value_problem
from controller.core.manifest.specs import (
    Deployment,
    DeploymentSpec,
    Devices,
    Entry,
    EnvFrom,
    image_ref_problem,
)
from controller.core.render import Rendered, container_image, render
from controller.core.state import ProbeConfig

POD_HOST = "0.0.0.0"
DEFAULT_PORT = 8000  # the manifest's default basePort: a pod's port is always free
PORT_NAME = "http"
SHM = "/dev/shm"
MANAGED_BY = "reconcile"
# Internal ports (VLLM_PORT, TGI's master and Prometheus ports, SGLang's NCCL port): a pod
# has its own network namespace, so torch.distributed's customary port is free there.
INTERNAL_PORT = 29500
# The device plugins' resource names. `kind: any` asks for the common one.
GPU_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu", "any": "nvidia.com/gpu"}
# In a pod the device plugin decides which GPUs the container sees; only the fence of
# an instance with no GPU (CUDA_VISIBLE_DEVICES="") still means something there.
VISIBILITY = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
)
DEFAULT_IMAGES = {
    "vllm": vllm.IMAGE,
    "sglang": sglang.IMAGE,
    "tgi": tgi.IMAGE,
    "ollama": ollama.IMAGE,
    "llama-cpp": llama_cpp.IMAGE,
}
# Engines whose pinned image is a CUDA build that does not start without a GPU (llama.cpp
# has a CPU build, picked by the device count; Ollama's image runs on either).
CUDA_ONLY = frozenset({"vllm", "sglang", "tgi"})

Object = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ExportGap:
    """A spec field with no faithful Kubernetes form, and what the user can do about it."""

    field: tuple[str, ...]  # the manifest path, e.g. ("spec", "devices", "candidates")
    message: str
    droppable: bool  # --lossy may drop it (else the user must change the manifest)
    # What the user may do instead, what --lossy does about it, and what it then did.
    fix: str = "remove it"
    lossy: str = "drop it"
    done: str = "dropped"


class ExportError(ValueError):
    """The deployment cannot be exported as asked; ``problems`` say where and why."""

    def __init__(self, problems: tuple[ExportGap, ...]) -> None:
        super().__init__("; ".join(p.message for p in problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class Exported:
    objects: tuple[Object, ...]
    dropped: tuple[ExportGap, ...]  # what --lossy left out (the caller warns)
    notes: tuple[ExportGap, ...] = ()  # exported, but a cluster needs more (the caller warns)


def export(
    deployment: Deployment,
    *,
    lossy: bool = False,
    namespace: str | None = None,
    folder: str | None = None,
) -> Exported:
    """The Kubernetes objects of one deployment; raises :class:`ExportError`.

    ``folder``: the manifest's, which a ``sopsFile`` is relative to (the Secret's hint
    names it from there, so it runs from any directory)."""
    problems = (
        *_name_problems(deployment),
        *_api_service_problems(deployment.name, namespace),
        *_label_problems(deployment),
        *problems_of(deployment.spec),
    )
    refused = tuple(p for p in problems if not (lossy and p.droppable))
    if refused:
        raise ExportError(refused)
    pod_deployment = _for_pod(deployment)
    workload = _workload(pod_deployment, namespace)
    scaler = _autoscaler(pod_deployment, namespace) if workload["kind"] == "Deployment" else None
    ranked = _priority_class(deployment.spec.priority)
    objects = (
        *([ranked] if ranked else []),
        workload,
        *([scaler] if scaler else []),
        _service(pod_deployment, namespace),
    )
    notes = ((_HPA_NOTE,) if scaler else ()) + ((_PRIORITY_NOTE,) if ranked else ())
    notes += _source_notes(deployment, namespace)
    notes += _secret_notes(deployment, folder, namespace) + _volume_notes(deployment.spec)
    notes += _ollama_notes(deployment.spec) + _local_model_notes(deployment.spec)
    notes += _arg_file_notes(deployment.spec) + _image_notes(deployment.spec)
    notes += _alias_notes(deployment.spec) + _secret_key_notes(pod_deployment)
    return Exported(objects=objects, dropped=problems, notes=notes)


# Why each droppable field has no Kubernetes form (the message then says what to do).
WHY_CANDIDATES = (
    "the scheduler picks a pod's GPUs, not its manifest (pin a node with a nodeSelector)"
)
WHY_SHAREABLE = "a GPU limit leases whole devices; there is no shared lease"
WHY_MEMORY = "a GPU limit leases whole devices; there is no per-device memory request"
WHY_APPLE = "no Apple GPU runs in a pod (set devices.kind to nvidia, amd or cpu)"
# A cpu device is an entry of this node's inventory (`--devices cpu:0`), leased whole:
# what it stands for (a core, a socket) is the operator's word, so no count of cores
# follows from it.
WHY_CPU = (
    "a cpu device is a slot of this node's inventory (cpu:0), not a number of cores, so it "
    "has no pod resource (size the pod's CPU in the cluster, e.g. `kubectl set resources "
    "--requests=cpu=N`)"
)
# Kubernetes' only Service affinity is by client address: behind an ingress or a load
# balancer every client is one address, so it would pin all traffic to one pod. reconcile
# keys on x-session-id or the OpenAI `user` field: hash on that at the ingress instead.
WHY_AFFINITY = (
    "a Service's sessionAffinity is ClientIP only, which behind an ingress puts every "
    "client on one pod (hash on the x-session-id header at your ingress instead, e.g. "
    "ingress-nginx's upstream-hash-by)"
)
# Left to its default, prefix affinity is the gateway's choice and exports to nothing;
# asked for by name, its loss is said.
WHY_PREFIX = (
    "a Service balances by connection and knows no prompt (the Gateway API Inference "
    "Extension's prefix-cache scorer routes by prefix on Kubernetes)"
)
WHY_FALLBACKS = (
    "a Service routes to its own pods only (a fallback model is an AI gateway's job: "
    "route it at your gateway, e.g. LiteLLM's fallbacks)"
)
WHY_COMPLETION = (
    "a pod's probes cannot POST a completion (httpGet only GETs; an exec probe would need "
    "curl in the image): use httpGet"
)
WHY_MIN_ZERO = "a HorizontalPodAutoscaler never scales below 1 (scale to zero needs KEDA)"
# A pod that runs until a request comes holds its GPU all day: the opposite of OnDemand.
WHY_ON_DEMAND = (
    "a Deployment's pod runs whether or not a request comes (starting on the first "
    "request and stopping after idleTimeout needs an HTTP scale-to-zero add-on, e.g. "
    "KEDA's HTTP add-on)"
)
WHY_JOB_SCALE = "a Job has no scale subresource: no HorizontalPodAutoscaler can scale it"
# Here a changed spec of a run-to-completion deployment rolls like any other; a Job's
# pod template is immutable, so a changed one is a new Job, the old one deleted first.
WHY_JOB_STRATEGY = (
    "a Job has no update strategy: its pod template cannot change once created (a changed "
    "spec is a new Job, the old one deleted first)"
)
UNLIMITED_RETRIES = 2**31 - 1  # a Job's backoffLimit is an int32: its largest
MAX_WINDOW = 3600  # seconds: the HPA's longest scale-down stabilization window
WHY_WINDOW = "a HorizontalPodAutoscaler's scale-down window is at most 1h"
WHY_METRIC = (
    "the HorizontalPodAutoscaler is exported on the gateway's requests in flight; the "
    "engines' own figures would need an adapter serving their series per pod"
)
METRIC = "reconcile_gateway_inflight"  # requests in flight per pod, as the gateway counts
_HPA_NOTE = ExportGap(
    ("spec", "autoscale"),
    f"exported as an autoscaling/v2 HorizontalPodAutoscaler on the per-pod metric {METRIC}: "
    "it needs a metrics adapter (prometheus-adapter) serving that metric for each pod",
    droppable=False,
)


_PRIORITY_NOTE = ExportGap(
    ("spec", "priority"),
    "exported as a cluster-wide PriorityClass (creating it needs cluster rights): its pods "
    "preempt every pod of lower priority on the cluster, not only this set's (a pod with no "
    "class has priority 0, as a deployment with no priority here)",
    droppable=False,
)


def _source_notes(deployment: Deployment, namespace: str | None) -> tuple[ExportGap, ...]:
    spec = deployment.spec
    source = spec.source
    if source is None:
        return ()
    text = (
        f"exported as the initContainer {exportpull.CONTAINER}, which downloads into an "
        f"emptyDir volume at {exportpull.MOUNT}: each pod pulls its own copy (mount a "
        f"shared volume named {exportpull.VOLUME} instead to pull once)"
    )
    if source.hugging_face is not None and "HF_TOKEN" not in spec.env:
        text += _token_note(deployment, namespace)
    secret = exportpull.url_secret(deployment.name, source)
    if secret is not None:
        text += (
            f"; source.url holds a password or token, so the pod reads it from the Secret "
            f"{secret} (key url), which is not exported: create it from a file holding the "
            f"URL alone (`{_create_secret(namespace)} {secret} --from-file=url=FILE`), "
            "never on the command line"
        )
    return (ExportGap(("spec", "source"), text, droppable=False),)


def _token_note(deployment: Deployment, namespace: str | None) -> str:
    """Where the download's HF_TOKEN comes from: the engine's envFrom Secret when it has
    one (the pull sees what the engine sees), else the optional shared one."""
    if deployment.spec.env_from:
        return (
            f"; it reads the Secret {secret_name(deployment.name)} as the engine does "
            "(spec.envFrom): for a gated or private repo, put HF_TOKEN in those files"
        )
    return (
        f"; HF_TOKEN comes from the Secret {exportpull.TOKEN_SECRET} (key token) if it "
        "exists: for a gated or private repo, create it from a file holding the token "
        f"alone (`{_create_secret(namespace)} {exportpull.TOKEN_SECRET} "
        "--from-file=token=FILE`), never on the command line"
    )


def _create_secret(namespace: str | None) -> str:
    """The hint's kubectl command: in the namespace the objects were exported to, where the
    pod looks for its Secret (kubectl's own default is the context's namespace)."""
    where = f" --namespace {shlex.quote(namespace)}" if namespace is not None else ""
    return f"kubectl create secret generic{where}"


def secret_name(name: str) -> str:
    """The Secret an exported deployment's envFrom expects: one per deployment."""
    return f"{name}-env"


def _secret_notes(
    deployment: Deployment, folder: str | None, namespace: str | None
) -> tuple[ExportGap, ...]:
    """envFrom's files stay on the node: the pod reads a Secret the user creates, with
    kubectl from the same files (a sopsFile through a pipe), so no value is ever on a
    command line (shell history, `ps`) or in a clear file."""
    items = deployment.spec.env_from
    if not items:
        return ()
    sources = " ".join(_env_file_flag(item, folder) for item in items)
    name = secret_name(deployment.name)
    text = (
        f"exported as envFrom: secretRef {name}, which is not exported (no value leaves "
        f"the node): create it from the same files with `{_create_secret(namespace)} "
        f"{name} {sources}` (bash); kubectl takes each line as KEY=VALUE as written (a "
        "line starting with `export` is refused, quotes stay in the value), so write the "
        "files' lines bare for both"
    )
    return (ExportGap(("spec", "envFrom"), text, droppable=False),)


def _env_file_flag(item: EnvFrom, folder: str | None) -> str:
    """One item as kubectl's ``--from-env-file``: a sopsFile decrypted into a pipe (bash's
    ``<(...)``) with the types reconcile gives sops, named from the manifest's folder."""
    if item.file is not None:
        return f"--from-env-file={shlex.quote(item.file)}"
    assert item.sops_file is not None
    path = str(PurePosixPath(folder, item.sops_file)) if folder else item.sops_file
    return f"--from-env-file=<(sops -d {SOPS_DOTENV} {shlex.quote(path)})"


SOPS_DOTENV = "--input-type dotenv --output-type dotenv"  # sops guesses a type by suffix


def _volume_notes(spec: DeploymentSpec) -> tuple[ExportGap, ...]:
    """A container's bind mounts are this node's folders: so is a hostPath, on whichever
    node the pod lands."""
    if spec.container is None or not spec.container.volumes:
        return ()
    hosts = ", ".join(host for _, host, _, _ in _binds(spec))
    text = (
        f"exported as hostPath volumes ({hosts}): the pod reads the folder of the node it "
        "runs on, so every node that may run it needs the same files there (a "
        "PersistentVolumeClaim in their place shares one copy)"
    )
    return (ExportGap(("spec", "container", "volumes"), text, droppable=False),)


def _local_model_notes(spec: DeploymentSpec) -> tuple[ExportGap, ...]:
    """A spec.model that is a path names this node's file (a local container gets its
    folder mounted); a pod has it only where a volume or the image puts it."""
    model = spec.model
    if spec.source is not None or model is None or not model.startswith("/"):
        return ()
    if any(PurePosixPath(model).is_relative_to(inside) for _, _, inside, _ in _binds(spec)):
        return ()
    text = (
        f"{model} is a path on this node, and no volume of the pod holds it: the engine "
        "finds it only if the image does (mount a volume there, or pull it with "
        "spec.source)"
    )
    return (ExportGap(("spec", "model"), text, droppable=False),)


# Files an engine reads at its start, named in spec.args, that reconcile reads too (the
# loader: store/sources/keyfile.py, engineconfig.py), and where a pod may keep them.
ARG_FILES = {
    ("llama-cpp", "--api-key-file"): "a Secret volume there keeps the keys out of the image",
    ("vllm", "--config"): "a ConfigMap volume there holds it",
}


def _arg_file_notes(spec: DeploymentSpec) -> tuple[ExportGap, ...]:
    """A file spec.args names on this node (llama.cpp's keys, vLLM's flags file): the
    engine reads it at its start, and in a pod finds it only where a volume or the
    image puts it (a local container gets its bind mounts, as the pod does)."""
    out = []
    for (engine, flag), where in ARG_FILES.items():
        path = value_of(engine, spec.args, flag) if spec.engine == engine else None
        if path is None or not path.startswith("/"):
            continue  # relative: refused by the loader; none: nothing to say
        if any(PurePosixPath(path).is_relative_to(inside) for _, _, inside, _ in _binds(spec)):
            continue
        text = (
            f"{flag} {path} is a file on this node, and no volume of the pod holds it: "
            f"{engine} does not start unless the image has it ({where})"
        )
        out.append(ExportGap(("spec", "args"), text, droppable=False))
    return tuple(out)


def _image_notes(spec: DeploymentSpec) -> tuple[ExportGap, ...]:
    """Both images written: the pod runs container.image, as this node does (image_of),
    and spec.image, the export's own field, would otherwise go unused without a word."""
    local = spec.container.image if spec.container is not None else None
    if spec.image is None or local is None or spec.image == local:
        return ()
    text = (
        f"the pod runs container.image {local}, as this node does, not spec.image "
        f"{spec.image}: remove spec.image, or container.image to run {spec.image} in the pod"
    )
    return (ExportGap(("spec", "image"), text, droppable=False),)


def _alias_notes(spec: DeploymentSpec) -> tuple[ExportGap, ...]:
    """Here the gateway answers a request for any alias; in a cluster a client reaches
    the Service by its name, and the engine answers only to the model it serves."""
    if not spec.aliases:
        return ()
    names = ", ".join(spec.aliases)
    text = (
        f"the aliases ({names}) are names the gateway routes: a Service has none, and the "
        "engine answers to its own model name only (route them at your gateway, e.g. "
        "LiteLLM's model aliases)"
    )
    return (ExportGap(("spec", "aliases"), text, droppable=False),)


def _secret_key_notes(deployment: Deployment) -> tuple[ExportGap, ...]:
    """An API key the engine may read from envFrom's Secret: a pass reads the files and
    its probes present the key; a pod's probe reads no Secret, so a probe of a path the
    engine keeps behind the key would fail (the recipes' /health is left open)."""
    spec = deployment.spec
    variable = KEY_VARIABLES.get(spec.engine)
    if variable is None or not spec.env_from or api_key(spec.engine, spec.args, spec.env):
        return ()
    rendered = _rendered(deployment)
    checks = (rendered.probe, rendered.liveness)
    paths = {c.http[0][0] for c in checks if c is not None and c.http and not c.completion}
    guarded = sorted(p for p in paths if not p.startswith("/health"))
    if not guarded:
        return ()
    text = (
        f"if the Secret of spec.envFrom sets {variable}, the engine keeps its API behind "
        f"that key, which reconcile's probes present and a pod's cannot (a probe reads no "
        f"Secret): the pod's probes GET {', '.join(guarded)}, so probe a path the engine "
        "leaves open (/health) instead"
    )
    return (ExportGap(("spec", "envFrom"), text, droppable=False),)


def _ollama_notes(spec: DeploymentSpec) -> tuple[ExportGap, ...]:
    """Here an Ollama deployment is Ready once /api/tags lists its model; a pod's probe
    cannot read a body, so it is Ready on `GET /` with an empty model store (`ollama
    serve` pulls nothing, and a pod has no store of the node's)."""
    if spec.engine != "ollama" or not spec.model:
        return ()
    text = (
        f"the pod's readinessProbe GETs / only (a probe cannot read /api/tags for "
        f"{spec.model}), and nothing pulls the model into the pod's empty store: the pod "
        "is Ready without it unless the image holds it or a volume at OLLAMA_MODELS does "
        "(filled by `ollama pull`)"
    )
    return (ExportGap(("spec", "model"), text, droppable=False),)


def _name_problems(deployment: Deployment) -> list[ExportGap]:
    """Names the API server would reject though the schema holds (kubernetes-validate
    checks no names): the Service is named as the deployment, and a Service's name is a
    DNS-1035 label (``7b-chat`` is not); the pod's engine container is too, beside the
    pull's initContainer; then the bind mounts (_mount_problems)."""
    name, spec = deployment.metadata.name, deployment.spec
    out = []
    if not name[0].isalpha():
        message = (
            f"a Kubernetes Service name must start with a letter (DNS-1035), and the "
            f"Service is named {name!r} after the deployment: rename it (e.g. m{name}) "
            "to export it"
        )
        out.append(ExportGap(("metadata", "name"), message, droppable=False))
    if spec.source is not None and name == exportpull.CONTAINER:
        message = (
            f"the engine's container is named {name!r} after the deployment, as is the "
            "initContainer that pulls spec.source, and a pod's container names must "
            "differ: rename the deployment to export it"
        )
        out.append(ExportGap(("metadata", "name"), message, droppable=False))
    return out + _mount_problems(spec)


API_SERVICE = "kubernetes"  # the API server's own Service, in the namespace `default`


def _api_service_problems(name: str, namespace: str | None) -> list[ExportGap]:
    """The Service named after a deployment `kubernetes`, applied in `default` (or in
    kubectl's context namespace, default unless set), is the API server's own: `kubectl
    apply` would give it a selector and a port, and pods would lose the API."""
    if name != API_SERVICE or namespace not in (None, "default"):
        return []
    where = "--namespace default" if namespace else "no --namespace (kubectl's usual default)"
    message = (
        f"the Service is named {name!r} after the deployment, and with {where} it would "
        "be the API server's own Service in the namespace default, which applying it "
        "rewrites: rename the deployment, or export it with --namespace NS"
    )
    return [ExportGap(("metadata", "name"), message, droppable=False)]


def _mount_problems(spec: DeploymentSpec) -> list[ExportGap]:
    """Bind mounts the API server would reject though the schema holds: one where the
    pulled model is mounted, two at one path, a hostPath with '..'."""
    out = []
    if spec.source is not None and exportpull.MOUNT in (b[2] for b in _binds(spec)):
        message = (
            f"{exportpull.MOUNT} is where the exported pod mounts the model spec.source "
            "pulls, and two mounts at one path are refused: mount this volume elsewhere"
        )
        out.append(ExportGap(("spec", "container", "volumes"), message, droppable=False))
    for host in (b[1] for b in _binds(spec) if ".." in PurePosixPath(b[1]).parts):
        message = (
            f"the host path {host} holds '..', which a hostPath may not (the API server "
            "refuses it): write the folder it means"
        )
        out.append(ExportGap(("spec", "container", "volumes"), message, droppable=False))
    insides = [b[2] for b in _binds(spec)]
    for inside in sorted({p for p in insides if insides.count(p) > 1}):
        message = (
            f"two volumes mount at {inside}, and a pod's container refuses two mounts at one "
            "path (so do podman and docker): keep one"
        )
        out.append(ExportGap(("spec", "container", "volumes"), message, droppable=False))
    return out


def _label_problems(deployment: Deployment) -> list[ExportGap]:
    """metadata.labels are free-form here, Kubernetes' label syntax there: the API server
    refuses every object that carries a label it cannot hold (kubernetes-validate checks
    no label), so each is refused, or left out with --lossy."""
    out = []
    for key, value in deployment.metadata.labels.items():
        problem = key_problem(key) or value_problem(value)
        if problem is not None:
            message = f"no Kubernetes form: {problem} there (the API server refuses it)"
            fix = "rename it or change its value"
            gap = ExportGap(("metadata", "labels", key), message, True, fix, "leave it out")
            out.append(gap)
    return out + _own_label_problems(deployment)


def _own_label_problems(deployment: Deployment) -> list[ExportGap]:
    """A label the export sets itself, given another value: the selector and the Service
    match the pods by these, so the user's value cannot be kept (refused, or left out)."""
    out = []
    for key, ours in _selector(deployment).items():
        value = deployment.metadata.labels.get(key)
        if value is not None and value != ours:
            message = (
                f"no Kubernetes form: the export sets {key}: {ours} on every object, and "
                f"the Service (and a Deployment's selector) match the pods by it, so "
                f"{value!r} cannot be kept"
            )
            fix = "remove it (or use another label)"
            gap = ExportGap(("metadata", "labels", key), message, True, fix, "leave it out")
            out.append(gap)
    return out


def problems_of(spec: DeploymentSpec) -> list[ExportGap]:
    devices = ("spec", "devices")
    out: list[ExportGap] = []
    if spec.devices.candidates is not None:
        out.append(_drop((*devices, "candidates"), WHY_CANDIDATES))
    if spec.devices.shareable:
        out.append(_drop((*devices, "shareable"), WHY_SHAREABLE))
    if spec.devices.memory is not None:
        out.append(_drop((*devices, "memory"), WHY_MEMORY))
    if spec.devices.kind == "apple" and spec.devices.count:
        out.append(_drop((*devices, "kind"), WHY_APPLE))
    if spec.devices.kind == "cpu" and spec.devices.count:
        message = f"no Kubernetes form: {WHY_CPU}"
        out.append(ExportGap((*devices, "count"), message, True, "set it to 0"))
    if spec.image is None and (spec.container is None or spec.container.image is None):
        out.extend(_image_problems(spec))
    elif image_of(spec) == spec.image:
        out.extend(_spec_image_problems(spec.image))
    if spec.affinity == "session":
        out.append(_drop(("spec", "affinity"), WHY_AFFINITY))
    if spec.affinity == "prefix":
        out.append(_drop(("spec", "affinity"), WHY_PREFIX))
    if spec.fallbacks:
        out.append(_drop(("spec", "fallbacks"), WHY_FALLBACKS))
    if spec.readiness is not None and spec.readiness.completion is not None:
        out.append(_drop(("spec", "readiness", "completion"), WHY_COMPLETION))
    if spec.liveness_probe is not None and spec.liveness_probe.completion is not None:
        out.append(_drop(("spec", "livenessProbe", "completion"), WHY_COMPLETION))
    if spec.activation == "OnDemand":
        message = f"no Kubernetes form: {WHY_ON_DEMAND}"
        fix, lossy = "set activation: Always", "export a pod that always runs"
        gap = ExportGap(("spec", "activation"), message, True, fix, lossy, "exported as Always")
        out.append(gap)
    if spec.restart_policy != "Always" and spec.strategy == "RollingUpdate":
        out.append(_drop(("spec", "strategy"), WHY_JOB_STRATEGY))
    out.extend(_scale_problems(spec))
    return out


def _scale_problems(spec: DeploymentSpec) -> list[ExportGap]:
    scale = spec.autoscale
    if scale is None:
        return []
    autoscale = ("spec", "autoscale")
    if spec.restart_policy != "Always":  # a Job
        return [_drop(autoscale, WHY_JOB_SCALE)]
    out = []
    if scale.min == 0:
        message = f"no Kubernetes form: {WHY_MIN_ZERO}"
        fix, lossy = "set it to 1", "export minReplicas: 1"
        out.append(ExportGap((*autoscale, "min"), message, True, fix, lossy, "exported as 1"))
    if scale.metric != "inflight":
        message = f"no Kubernetes form: {WHY_METRIC}"
        fix, lossy = "use metric: inflight", "export the autoscaler on requests in flight"
        out.append(
            ExportGap((*autoscale, "metric"), message, True, fix, lossy, "exported as inflight")
        )
    if scale.scale_down_delay > MAX_WINDOW:
        message = f"no Kubernetes form: {WHY_WINDOW}"
        fix, lossy = "set it to 1h or less", "export 1h"
        out.append(
            ExportGap((*autoscale, "scaleDownDelay"), message, True, fix, lossy, "exported as 1h")
        )
    return out


def _drop(field: tuple[str, ...], why: str) -> ExportGap:
    # The next move (remove it, or --lossy) is the caller's to say: it knows the flags.
    return ExportGap(field, f"no Kubernetes form: {why}", droppable=True)


def _image_problems(spec: DeploymentSpec) -> list[ExportGap]:
    image = ("spec", "image")
    if spec.engine == "command":
        message = "engine 'command' has no default image: set spec.image to an image "
        return [ExportGap(image, message + "that holds spec.command[0]", droppable=False)]
    if spec.devices.kind == "amd" and spec.devices.count:
        message = f"the pinned image {DEFAULT_IMAGES[spec.engine]} is not a ROCm build: "
        return [ExportGap(image, message + "set spec.image to one", droppable=False)]
    if spec.engine in CUDA_ONLY and _gpu_resource(spec.devices) is None:
        return [_no_gpu_problem(spec)]
    return []


def _no_gpu_problem(spec: DeploymentSpec) -> ExportGap:
    """A pod with no GPU and the pinned CUDA image: locally the engine is the user's own
    program (maybe a CPU build); in the pod it would be an image that cannot start."""
    devices = spec.devices
    why = f"spec.devices.kind is {devices.kind}" if devices.count else "spec.devices.count is 0"
    message = (
        f"the pinned image {DEFAULT_IMAGES[spec.engine]} is a CUDA build, and the pod asks "
        f"for no GPU ({why}): engine {spec.engine!r} does not start in it"
    )
    fix = "set spec.image to a build that runs without a GPU, or spec.devices.count to the GPUs"
    lossy, done = "export that image with no GPU", "exported with no GPU"
    return ExportGap(("spec", "image"), message, True, fix, lossy, done)


def _spec_image_problems(image: str) -> list[ExportGap]:
    """spec.image is the export's alone, so only the export checks it, as the spec checks
    container.image: the API server or the kubelet refuses what is no image reference."""
    problem = image_ref_problem(image)
    if problem is None:
        return []
    message = f"no pod can pull it: {problem}"
    return [ExportGap(("spec", "image"), message, droppable=False)]


# -- the pod's view of the spec ---------------------------------------------------------


def _for_pod(deployment: Deployment) -> Deployment:
    """The spec as it runs in a pod: dropped fields gone, listening on the pod's address."""
    spec = deployment.spec
    devices = spec.devices
    if devices.kind in ("apple", "cpu"):  # no pod resource: dropped (problems_of)
        devices = Devices(count=0)
    else:
        dropped = {"candidates": None, "shareable": False, "memory": None}
        devices = devices.model_copy(update=dropped)
    update: dict[str, Any] = {"host": POD_HOST, "devices": devices}
    if spec.image is None and spec.container is None:
        # The pinned image's own program: spec.executable names a path on the host. In a
        # container (`container: {}` runs the pinned image too) it is a path inside the
        # image, run here as in the pod.
        update["executable"] = image_program(spec.engine)
    return deployment.model_copy(update={"spec": spec.model_copy(update=update)})


def _port(spec: DeploymentSpec) -> int:
    return spec.port or spec.base_port or DEFAULT_PORT


def _stand_ins(devices: Devices) -> tuple[Device, ...]:
    """Devices as the container sees them: the plugin numbers its GPUs from 0."""
    kind = "nvidia" if devices.kind == "any" else devices.kind
    return tuple(Device(kind=kind, id=str(i)) for i in range(devices.count))


def _internal_ports(port: int, count: int) -> tuple[int, ...]:
    candidates = (p for p in range(INTERNAL_PORT, INTERNAL_PORT + count + 1) if p != port)
    return tuple(next(candidates) for _ in range(count))


def _rendered(deployment: Deployment) -> Rendered:
    spec = deployment.spec
    port = _port(spec)
    extra = _internal_ports(port, recipe_for(spec.engine).extra_ports)
    entry = Entry(deployment, "", 0, "")
    devices = _stand_ins(spec.devices)
    # `{python}` is this host's interpreter; in the image it is the image's own python3.
    # `{model}` of a spec.source: the file its initContainer pulls into the shared volume.
    model = exportpull.model_path(spec.source) if spec.source is not None else None
    return render(
        entry, devices=devices, port=port, extra_ports=extra, python="python3", model_path=model
    )


def image_of(spec: DeploymentSpec) -> str:
    """The pod's image: ``spec.container.image``, ``spec.image``, else the recipe's pinned
    one (the CUDA build of llama.cpp for an instance that holds a GPU)."""
    if spec.image is not None and (spec.container is None or spec.container.image is None):
        return spec.image
    return container_image(spec)


def _gpu_resource(devices: Devices) -> str | None:
    return GPU_RESOURCES.get(devices.kind) if devices.count else None


# -- the objects ------------------------------------------------------------------------


def _labels(deployment: Deployment) -> dict[str, str]:
    """The user's labels that Kubernetes can hold (--lossy left the others out), ours."""
    labels = deployment.metadata.labels
    kept = {k: v for k, v in labels.items() if not (key_problem(k) or value_problem(v))}
    return {**kept, **_selector(deployment)}


def _selector(deployment: Deployment) -> dict[str, str]:
    return {"app.kubernetes.io/name": deployment.name, "app.kubernetes.io/managed-by": MANAGED_BY}


def _metadata(deployment: Deployment, namespace: str | None) -> Object:
    meta: Object = {"name": deployment.name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = _labels(deployment)
    return meta


def _workload(deployment: Deployment, namespace: str | None) -> Object:
    spec = deployment.spec
    template = {"metadata": {"labels": _labels(deployment)}, "spec": _pod(deployment)}
    if spec.restart_policy == "Always":
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _metadata(deployment, namespace),
            "spec": {
                **_replicas(spec),
                "selector": {"matchLabels": _selector(deployment)},
                "strategy": _strategy(spec),
                "template": template,
            },
        }
    # Never: one run, no second pod. OnFailure: restarted with back-off for as long as it
    # fails, as here; a Job's default gives up after 6 (container restarts count).
    limit = 0 if spec.restart_policy == "Never" else UNLIMITED_RETRIES
    job_spec: Object = {"backoffLimit": limit, **_parallel(spec.replicas), "template": template}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(deployment, namespace),
        "spec": job_spec,
    }


def _replicas(spec: DeploymentSpec) -> Object:
    """``replicas``; none with an autoscaler: the HPA owns the count, and a ``replicas`` in
    the applied manifest would reset it at every ``kubectl apply`` (Kubernetes' advice)."""
    return {} if spec.autoscale is not None else {"replicas": spec.replicas}


def _parallel(replicas: int) -> Object:
    """A Job of N replicas: N pods at once, each to run to completion (0: none)."""
    if replicas == 1:
        return {}
    return {"parallelism": replicas, "completions": replicas} if replicas else {"parallelism": 0}


def _strategy(spec: DeploymentSpec) -> Object:
    if spec.strategy == "Recreate":
        return {"type": "Recreate"}
    rolling = spec.rolling_update
    if rolling is not None:  # IntOrString both: Kubernetes' own meaning
        bounds = {"maxSurge": rolling.max_surge, "maxUnavailable": rolling.max_unavailable}
        return {"type": "RollingUpdate", "rollingUpdate": bounds}
    # The new pod Ready before the old one stops, never two old ones gone: reconcile's rule.
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def _autoscaler(deployment: Deployment, namespace: str | None) -> Object | None:
    """``autoscale`` as an HPA aiming at ``targetInflight`` requests in flight per pod."""
    scale = deployment.spec.autoscale
    if scale is None:
        return None
    window = min(math.ceil(scale.scale_down_delay), MAX_WINDOW)
    # The aim the autoscaler here takes: `target` when written for inflight, else
    # targetInflight (also under --lossy, which exports another metric as inflight).
    aim = scale.target_of("inflight")
    target = {"type": "AverageValue", "averageValue": _quantity(aim)}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(deployment, namespace),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": deployment.name,
            },
            "minReplicas": max(1, scale.min),  # 0 only with --lossy: refused otherwise
            "maxReplicas": scale.max,
            "metrics": [{"type": "Pods", "pods": {"metric": {"name": METRIC}, "target": target}}],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": window}},
        },
    }


def _quantity(value: float) -> str:
    """A Kubernetes quantity: whole numbers as such, else in thousandths (``2500m``)."""
    return str(int(value)) if value == int(value) else f"{max(1, round(value * 1000))}m"


def priority_class_name(priority: int) -> str:
    """One PriorityClass per value, shared by every deployment of that priority."""
    return (
        f"reconcile-priority-{priority}"
        if priority >= 0
        else f"reconcile-priority-minus-{-priority}"
    )


def _priority_class(priority: int) -> Object | None:
    """``priority`` as Kubernetes says it: a pod of a higher class preempts strictly lower
    ones when the nodes run short, as an engine does here when devices run short. 0 is a
    classless pod's priority (no globalDefault), so it needs none."""
    if priority == 0:
        return None
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": priority_class_name(priority),
            "labels": {"app.kubernetes.io/managed-by": MANAGED_BY},
        },
        "value": priority,  # within a user class's range (PRIORITY_LIMIT)
        "globalDefault": False,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": f"spec.priority {priority} of deployments exported by reconcile",
    }


def _pod(deployment: Deployment) -> Object:
    spec = deployment.spec
    pod: Object = {
        "restartPolicy": spec.restart_policy,
        "terminationGracePeriodSeconds": math.ceil(spec.stop_grace_period_seconds),
        "containers": [_container(deployment)],
    }
    if spec.priority:
        pod["priorityClassName"] = priority_class_name(spec.priority)
    if spec.node_selector:  # the same label match, made by the scheduler
        pod["nodeSelector"] = dict(sorted(spec.node_selector.items()))
    volumes: list[Object] = []
    if _shm(spec):
        # Engines that shard over GPUs talk through /dev/shm, which a pod caps at 64 MiB.
        shm: Object = {"medium": "Memory"}
        if spec.container is not None and spec.container.shm_size is not None:
            shm["sizeLimit"] = _bytes(spec.container.shm_size)
        volumes.append({"name": "dshm", "emptyDir": shm})
    for name, host, _, _ in _binds(spec):
        volumes.append({"name": name, "hostPath": {"path": host}})
    if spec.source is not None:  # the model, pulled before the engine starts
        secret = secret_name(deployment.name) if spec.env_from else None
        url_from = exportpull.url_secret(deployment.name, spec.source)
        pull = exportpull.init_container(
            spec.source, spec.env, env_secret=secret, url_from=url_from
        )
        pod["initContainers"] = [pull]
        volumes.append(exportpull.volume())
    if volumes:
        pod["volumes"] = volumes
    return pod


def _shm(spec: DeploymentSpec) -> bool:
    """A /dev/shm of its own: for GPUs (a pod's is 64 MiB), or at the size asked; none
    when a bind mount is the /dev/shm (two mounts at one path: the API server refuses)."""
    if SHM in (inside for _, _, inside, _ in _binds(spec)):
        return False
    sized = spec.container is not None and spec.container.shm_size is not None
    return sized or _gpu_resource(spec.devices) is not None


def _binds(spec: DeploymentSpec) -> list[tuple[str, str, str, bool]]:
    """The container's bind mounts (``host:container[:ro]``, checked by the spec): each
    as its volume's name, the host path, the path inside, and whether it is read-only."""
    volumes = spec.container.volumes if spec.container is not None else ()
    out = []
    for i, volume in enumerate(volumes):
        host, inside, *mode = volume.split(":")
        # As the runtime and the kubelet see it: `/x/` and `/x` are one place.
        out.append((f"host-{i}", host, str(PurePosixPath(inside)), mode == ["ro"]))
    return out


def _bytes(size: int) -> str:
    """Bytes as an exact Kubernetes quantity (``16Gi``; plain bytes when no unit divides)."""
    for unit, scale in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def _container(deployment: Deployment) -> Object:
    spec = deployment.spec
    rendered = _rendered(deployment)
    container: Object = {
        "name": deployment.name,
        "image": image_of(spec),
        # The kubelet would expand `$(VAR)` and `$$` in these; locally nothing does.
        "command": [literal(rendered.argv[0])],
        "args": [literal(a) for a in rendered.argv[1:]],
        "env": [{"name": k, "value": literal(v)} for k, v in _env(spec, rendered).items()],
        "ports": [{"name": PORT_NAME, "containerPort": _port(spec), "protocol": "TCP"}],
    }
    if spec.env_from:  # the values are the node's: the cluster's come from a Secret
        container["envFrom"] = [{"secretRef": {"name": secret_name(deployment.name)}}]
    if spec.container is not None and spec.container.pull_policy is not None:
        container["imagePullPolicy"] = spec.container.pull_policy  # the same words
    resource = _gpu_resource(spec.devices)
    mounts: list[Object] = []
    if resource is not None:
        container["resources"] = {"limits": {resource: spec.devices.count}}
    if _shm(spec):
        mounts.append({"name": "dshm", "mountPath": SHM})
    for name, _, inside, read_only in _binds(spec):
        mounts.append(
            {"name": name, "mountPath": inside, **({"readOnly": True} if read_only else {})}
        )
    if spec.source is not None:
        mounts.append(exportpull.volume_mount())
    if mounts:
        container["volumeMounts"] = mounts
    container.update(_probes(rendered, api_key(spec.engine, spec.args, spec.env)))
    return container


def _env(spec: DeploymentSpec, rendered: Rendered) -> dict[str, str]:
    if _gpu_resource(spec.devices) is None:
        return rendered.env
    return {k: v for k, v in rendered.env.items() if k not in VISIBILITY}


def _probes(rendered: Rendered, key: str) -> Object:
    """readinessProbe, and a startupProbe: failureThreshold * periodSeconds >= the deadline;
    the livenessProbe as it is (Kubernetes' meaning is ours). ``key``: the API key the
    engine demands (its spec's --api-key or variable), which our probes present here."""
    period = max(1, math.ceil(rendered.probe.period_seconds))  # Kubernetes counts whole seconds
    failures = max(1, math.ceil(rendered.deadline_seconds / period))
    readiness = _probe(rendered.probe, key, periodSeconds=period)
    startup = _probe(rendered.probe, key, periodSeconds=period, failureThreshold=failures)
    out: Object = {}
    if readiness is not None and startup is not None:  # none: ready once it runs
        out = {"readinessProbe": readiness, "startupProbe": startup}
    live = rendered.liveness
    liveness = (
        None
        if live is None
        else _probe(
            live,
            key,
            periodSeconds=max(1, math.ceil(live.period_seconds)),
            timeoutSeconds=max(1, math.ceil(live.timeout_seconds)),
            failureThreshold=live.failure_threshold,
        )
    )
    if liveness is not None:
        out["livenessProbe"] = liveness
    return out


def _probe(probe: ProbeConfig, key: str, **settings: int) -> Object | None:
    """The first HTTP check (a pod cannot match a body), else TCP, else none (a completion
    has no pod form: refused unless --lossy, see problems_of). An engine given an API key
    answers 401 without it on a path it keeps behind the key (vLLM's /v1/...), so the
    check presents it, as ours do (host/probes.py): it is in the spec's args or env, and
    so in the pod's, already.

    Built afresh for each probe: shared dicts would print as YAML anchors.
    """
    if probe.completion:
        return None
    if probe.http:
        get: Object = {"path": probe.http[0][0], "port": PORT_NAME}
        if key:
            get["httpHeaders"] = [{"name": "Authorization", "value": f"Bearer {key}"}]
        return {"httpGet": get, **settings}
    if probe.tcp:
        return {"tcpSocket": {"port": PORT_NAME}, **settings}
    return None


def _service(deployment: Deployment, namespace: str | None) -> Object:
    port = _port(deployment.spec)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(deployment, namespace),
        "spec": {
            "selector": _selector(deployment),
            "ports": [
                {"name": PORT_NAME, "port": port, "targetPort": PORT_NAME, "protocol": "TCP"}
            ],
        },
    }
