"""The Deployment manifest as frozen pydantic models (no I/O).

The manifest uses Kubernetes' camelCase; Python code uses snake_case through
aliases. Unknown fields are errors everywhere (``extra="forbid"``). Numbers written
as strings are taken (pydantic's lax mode), as they always were; booleans are not.
"""

from __future__ import annotations

import functools
import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from controller.core.digest import sha256_hex
from controller.core.manifest import hints
from controller.core.manifest.engineenv import not_reconciles, without_fixed
from controller.core.manifest.excerpt import did_you_mean, short
from controller.core.manifest.labels import Labels

# re-exported: their home is core.names, which records import without the specs
from controller.core.manifest.names import DNS1123 as DNS1123
from controller.core.manifest.names import NEXT_SUFFIX as NEXT_SUFFIX
from controller.core.manifest.names import base_name as base_name
from controller.core.manifest.names import is_dns1123 as is_dns1123
from controller.core.manifest.names import is_next as is_next
from controller.core.manifest.names import model_names
from controller.core.manifest.names import next_name as next_name
from controller.core.manifest.quantity import parse_quantity
from controller.core.manifest.sources import Source

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PLACEHOLDER_NAMES = ("port", "host", "name", "model", "devices", "python")
PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDER_NAMES) + r")\}")
# What reads as a placeholder: a bare word in single braces. `${HOME}`, a Jinja `{{ x }}`
# and JSON (`{"a": 1}`) do not, and pass to the engine as written.
WORD_IN_BRACES = re.compile(r"(?<![{$])\{([A-Za-z_][A-Za-z0-9_-]*)\}(?!\})")

Engine = Literal["vllm", "llama-cpp", "sglang", "tgi", "ollama", "command"]
DeviceKind = Literal["nvidia", "amd", "apple", "cpu", "any"]
RestartPolicy = Literal["Always", "OnFailure", "Never"]
Activation = Literal["Always", "OnDemand"]
Strategy = Literal["Recreate", "RollingUpdate"]
DEFAULT_IDLE_TIMEOUT = 600.0

# Fields that never change what runs on this node: `image` is read by `reconcile export`
# alone; `activation`, `idleTimeout`, `strategy` and `aliases` by the gateway and the
# planner (when and how, not what). They stay out of the spec hash, so setting them (or
# upgrading to a version that knows them) never restarts an engine.
# `replicas`, `autoscale`, `affinity` and `rollingUpdate` say how many engines and how
# traffic and updates reach them, never what one engine runs.
# `nodeSelector` says which node runs it: a node it still matches keeps its engine.
NOT_HASHED = frozenset(
    {
        "image",
        "activation",
        "idleTimeout",
        "strategy",
        "aliases",
        "replicas",
        "autoscale",
        "affinity",
        "rollingUpdate",
        "fallbacks",
        "fallbackAfter",
        "nodeSelector",
    }
)
MAX_REPLICAS = 64
Affinity = Literal["none", "session", "prefix"]


def _scalar_to_str(value: Any) -> Any:
    """YAML reads `8192` as an int; argv and env values are strings, so accept numbers."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _duration(value: Any) -> Any:
    """``idleTimeout: 10m`` (or plain seconds) -> seconds."""
    value = _not_bool(value)
    if isinstance(value, str):
        from controller.core.manifest.quantity import parse_duration

        return parse_duration(value)
    return value


def _known_placeholders(template: str) -> str:
    """An argv item whose every ``{word}`` is a placeholder we expand (JSON braces pass)."""
    for word in WORD_IN_BRACES.findall(template):
        if word in PLACEHOLDER_NAMES:
            continue
        meant = did_you_mean(word, PLACEHOLDER_NAMES, cutoff=0.7)
        hint = f": did you mean {{{meant}}}?" if meant else ""
        known = " ".join(f"{{{n}}}" for n in PLACEHOLDER_NAMES)
        raise ValueError(
            f"unknown placeholder {short('{' + word + '}')}{hint} (placeholders: {known})"
        )
    return template


def _dns1123(name: str) -> str:
    if not is_dns1123(name):
        raise ValueError(
            f"name {short(name)} is not a DNS-1123 label: lower-case letters, digits "
            "and '-', starting and ending with a letter or digit, at most 63 characters"
        )
    return name


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"httpGet.path {path!r} must start with '/'")
    return path


# RFC 1123 host names (`localhost`, `gpu-box.lan`); IP addresses are ipaddress' to check.
HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


def _bind_address(host: str) -> str:
    """An address the engine can bind and the probes reach: an IP or a host name, bare
    (`localhost:8000` or `http://0.0.0.0` reached the engine's --host as written)."""
    if _is_address(host):
        return host
    bare = host.split("://", 1)[-1].split("/", 1)[0]
    bare = bare if bare.count(":") > 1 else bare.split(":", 1)[0]  # IPv6 keeps its colons
    bare = bare.strip("[]")
    hint = f": write host: {json.dumps(bare)}" if _is_address(bare) else ""
    raise ValueError(
        f"host {short(host)} is not an address to bind: an IP address or a host name, "
        f"without a scheme or a port (the port is spec.port or spec.basePort){hint}"
    )


def _is_address(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return bool(HOST_NAME.match(host))
    return True


def _env_names(env: dict[str, str]) -> dict[str, str]:
    for key, value in env.items():
        if not ENV_NAME.match(key):
            raise ValueError(f"env name {key!r} is not a valid environment variable name")
        placeholder = PLACEHOLDER.search(value)
        if placeholder:  # it reached the engine as the literal text
            raise ValueError(
                f"env {key}: {placeholder.group(0)} is not expanded in env (placeholders are "
                "for command and args); the engine's environment has PORT, RECONCILE_NAME "
                "and RECONCILE_INSTANCE, or pass the value in args"
            )
    return env


def _not_bool(value: Any) -> Any:
    """pydantic's lax mode reads True as 1, but YAML reads `on`, `yes`, `true` as True:
    a typo there must not become one device or port 1."""
    if isinstance(value, bool):
        raise ValueError(
            f"Input should be a number, not {str(value).lower()} "
            "(YAML reads yes/no/on/off/true/false as booleans)"
        )
    return value


# Numbers as the manifests always took them: 8080 or "8080", never a boolean. Bounds go
# before it in an Annotated (``Annotated[int, Field(ge=0), NOT_BOOL]``): so they reach the
# JSON Schema as minimum/maximum.
NOT_BOOL = BeforeValidator(_not_bool)


# The schema says what the loader takes: numbers too (YAML reads `8192` as an int).
def _no_nul(value: str) -> str:
    """A NUL byte ends a C string: the OS refuses it in an argv or an environment (a
    process's start died of Python's `ValueError: embedded null byte`, a container's of
    runc's refusal, said as its program missing)."""
    if "\0" in value:
        raise ValueError(
            "holds a NUL byte (\\0), which no argument or environment value can: remove it"
        )
    return value


Arg = Annotated[
    str,
    BeforeValidator(_scalar_to_str, json_schema_input_type=str | int | float),
    AfterValidator(_no_nul),
]
# An argv item of `command` or `args`: its placeholders are checked here, at validate, since
# a mistyped one reaches the engine as written and it dies of it (`invalid int: '{prot}'`).
Template = Annotated[Arg, AfterValidator(_known_placeholders)]
Port = Annotated[int, Field(ge=1, le=65535), NOT_BOOL]
# A spec.env key: checked one by one, so an error names the key's own line (spec.env.PORT).
EnvKey = Annotated[str, AfterValidator(not_reconciles)]
Seconds = Annotated[
    float,
    Field(gt=0, le=30 * 86400),
    BeforeValidator(_duration, json_schema_input_type=str | float),
]
# Kubernetes-style quantity (`20Gi`) kept as whole bytes; the schema shows what users write.
Memory = Annotated[int, BeforeValidator(parse_quantity, json_schema_input_type=str | int)]


def _shm_size(value: object) -> int:
    """A size as any other; a zero one said in its own words: quantity's say to leave a
    size out for a whole device, which is devices.memory's, not /dev/shm's."""
    try:
        return parse_quantity(value)
    except ValueError as exc:
        if "is zero" not in str(exc):
            raise
        raise ValueError(
            f"shmSize {value!r} is zero: /dev/shm is at least 1 byte (leave shmSize out for "
            "the runtime's default, 64Mi)"
        ) from None


ShmSize = Annotated[int, BeforeValidator(_shm_size, json_schema_input_type=str | int)]
AUTO = "auto"  # devices.memory: the last measurement + 10%
PRIORITY_LIMIT = 1_000_000_000  # Kubernetes' user PriorityClass range, both ways


class Model(BaseModel):
    """camelCase in manifests (``basePort``), snake_case in Python; no unknown field."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class Metadata(Model):
    name: Annotated[str, AfterValidator(_dns1123)] = Field(
        max_length=63,
        description="DNS-1123 label: lower-case letters, digits and '-', at most 63 characters.",
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Free-form string labels; changing them never restarts the engine.",
    )


class Devices(Model):
    count: Annotated[int, Field(ge=0, le=64), NOT_BOOL] = Field(
        default=0,
        description="Devices needed; 0 = none (the engine then sees CUDA_VISIBLE_DEVICES='').",
    )
    kind: DeviceKind = Field(
        default="any", description="nvidia, amd, apple, cpu, or any (default any)."
    )
    candidates: tuple[Arg, ...] | None = Field(
        default=None, description="Only these device ids (e.g. ['0', '1'])."
    )
    shareable: bool = Field(
        default=False, description="Unified-memory devices stack instead of leasing exclusively."
    )
    # Memory on EACH of the `count` devices; set, devices are shared and packed by memory.
    memory: Memory | None = Field(
        default=None,
        description="Memory needed on EACH device, e.g. 20Gi (Ki, Mi, Gi, Ti; k, M, G, T): "
        "devices are then shared and packed by memory. Unset: whole devices. auto: the "
        "engine's last measured peak + 10% (NVML hosts), whole devices until measured.",
    )
    # `memory: auto`: `memory` stays None (a whole lease) until the planner resolves it
    # from a measurement (core/planner/ledger.py); private, so no manifest can spell it.
    _auto: bool = PrivateAttr(default=False)

    @property
    def memory_auto(self) -> bool:
        return self._auto

    @model_validator(mode="wrap")
    @classmethod
    def _memory_auto(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        auto = isinstance(data, dict) and data.get("memory") == AUTO
        devices = handler({**data, "memory": None} if auto else data)
        devices._auto = auto or devices._auto
        return devices

    @model_validator(mode="after")
    def _memory_needs_devices(self) -> Self:
        if (self.memory is not None or self._auto) and self.count == 0:
            raise ValueError(
                "devices.memory is the share of each device, but devices.count is 0: "
                "set devices.count (at least 1) or drop devices.memory"
            )
        return self


class HttpGet(Model):
    path: Annotated[str, AfterValidator(_absolute)] = Field(
        default="/health", description="The path to GET, starting with '/' (default /health)."
    )


class TcpSocket(Model):
    pass


class Completion(Model):
    """A one-token completion for the spec's model (the recipe's chat or completions path)."""


COMPLETION_HELP = (
    "Healthy when a completion for spec.model (POST /v1/chat/completions or /v1/completions, "
    "as the recipe knows; max_tokens 16) answers 200 with a choice: for engines whose "
    "/health answers while the GPU is gone."
)


class Readiness(Model):
    http_get: HttpGet | None = Field(
        default=None, description="Ready when GET path answers 200-399 (redirects not followed)."
    )
    tcp_socket: TcpSocket | None = Field(
        default=None, description="Ready when the port accepts a connection."
    )
    completion: Completion | None = Field(default=None, description=COMPLETION_HELP)
    deadline_seconds: Annotated[float, Field(gt=0, le=7 * 86400), NOT_BOOL] | None = Field(
        default=None,
        description="Not ready by then: killed and retried with back-off (default 600).",
    )
    period_seconds: Annotated[float, Field(ge=0.1, le=3600), NOT_BOOL] = Field(
        default=2.0, description="Seconds between probes (default 2)."
    )

    @model_validator(mode="after")
    def _one_probe(self) -> Self:
        _one_kind("readiness", self)
        return self


def _one_kind(where: str, probe: Readiness | LivenessProbe) -> None:
    named: dict[str, Model | None] = {
        "httpGet": probe.http_get,
        "tcpSocket": probe.tcp_socket,
        "completion": probe.completion,
    }
    given = [k for k, v in named.items() if v is not None]
    if len(given) > 1:
        raise ValueError(f"{where} takes {' or '.join(given)}, not both")


class LivenessProbe(Model):
    """Kubernetes' livenessProbe: once Ready, failureThreshold failures in a row restart."""

    http_get: HttpGet | None = Field(
        default=None, description="Alive while GET path answers 200-399 (redirects not followed)."
    )
    tcp_socket: TcpSocket | None = Field(
        default=None, description="Alive while the port accepts a connection."
    )
    completion: Completion | None = Field(default=None, description=COMPLETION_HELP)
    period_seconds: Annotated[float, Field(ge=0.1, le=3600), NOT_BOOL] = Field(
        default=10.0, description="Seconds between probes once Ready (default 10)."
    )
    timeout_seconds: Annotated[float, Field(gt=0, le=3600), NOT_BOOL] = Field(
        default=5.0, description="A probe with no answer by then fails (default 5)."
    )
    failure_threshold: Annotated[int, Field(ge=1, le=1000), NOT_BOOL] = Field(
        default=3,
        description="Failures in a row that restart the engine (default 3): a restart "
        "like a crash's, with the usual back-off.",
    )
    enabled: bool = Field(
        default=True,
        description="false: no liveness probe, not even the recipe's default.",
    )

    @model_validator(mode="after")
    def _one_probe(self) -> Self:
        _one_kind("livenessProbe", self)
        return self


Replicas = Annotated[int, Field(ge=0, le=MAX_REPLICAS), NOT_BOOL]


def _surge(value: Any) -> Any:
    """``1`` or ``"25%"`` (Kubernetes' IntOrString), checked here as Kubernetes does: a
    string that is no percentage ("abc", "25") or a negative count is refused, not left
    for the rollout to trip on."""
    if isinstance(value, str):
        number = value.removesuffix("%")
        if number == value or not number.isdigit() or int(number) > 100:
            raise ValueError(
                f"{short(value)} is not a percentage from 0% to 100% (or write a count, 0 or more)"
            )
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise ValueError(f"{value} is below 0: a count of replicas, 0 or more (or a percentage)")
    return _not_bool(value)


Surge = Annotated[int | str, BeforeValidator(_surge)]


DEFAULT_TARGETS = {"waiting": 2.0, "kvCache": 0.8}  # per Ready replica


class Autoscale(Model):
    min: Replicas = Field(
        default=1, description="The fewest replicas (0: scale to zero, Idle until a request)."
    )
    max: Annotated[int, Field(ge=1, le=MAX_REPLICAS), NOT_BOOL] = Field(
        description="The most replicas the autoscaler starts."
    )
    target_inflight: Annotated[float, Field(gt=0, le=100_000), NOT_BOOL] = Field(
        default=4.0,
        description="Requests in flight per Ready replica it aims for (default 4).",
    )
    scale_down_delay: Seconds = Field(
        default=300.0,
        description="Load must stay low this long before a replica goes (default 5m).",
    )
    metric: Literal["inflight", "waiting", "kvCache"] = Field(
        default="inflight",
        description="What it aims at: the gateway's requests in flight (default), the "
        "engines' own requests waiting, or their KV cache use. An engine without metrics "
        "keeps inflight.",
    )
    target: Annotated[float | None, Field(gt=0, le=100_000), NOT_BOOL] = Field(
        default=None,
        description="The metric's aim per Ready replica: requests waiting (default 2), or "
        "KV cache use 0..1 (default 0.8); for inflight, targetInflight's.",
    )

    @field_validator("target")
    @classmethod
    def _ratio(cls, value: float | None, info: ValidationInfo) -> float | None:
        # A field check (metric comes first), so the error names target's own line.
        if info.data.get("metric") == "kvCache" and value is not None and value > 1:
            raise ValueError(
                f"{value:g} is above 1: with metric kvCache the target is the KV cache's "
                "fill per replica, 0..1 (0.8: 80%)"
            )
        return value

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min > self.max:
            raise ValueError(f"autoscale.min ({self.min}) is above autoscale.max ({self.max})")
        if self.metric != "inflight" and "target_inflight" in self.model_fields_set:
            raise ValueError(
                f"autoscale.targetInflight is inflight's aim, not {self.metric}'s: "
                "use autoscale.target"
            )
        return self

    def target_of(self, metric: str) -> float:
        """The aim per Ready replica for ``metric`` (the edge may fall back to inflight)."""
        if metric == self.metric and self.target is not None:
            return self.target
        if metric == "inflight":
            return self.target_inflight
        return DEFAULT_TARGETS[metric]


class RollingUpdate(Model):
    max_surge: Surge = Field(
        default=1,
        description="Replicas started beyond the desired count during an update (a number "
        "or a percentage; default 1).",
    )
    max_unavailable: Surge = Field(
        default=0,
        description="Replicas that may be down during an update (a number or a percentage; "
        "default 0).",
    )


# An image reference as docker and podman take it: [registry[:port]/]path[:tag][@digest].
IMAGE_REF = re.compile(
    r"^(?:[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?/)?"  # a registry (or the path's first part)
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@sha256:[a-f0-9]{64})?$"
)
PullPolicy = Literal["Always", "IfNotPresent", "Never"]
ContainerRuntime = Literal["podman", "docker"]


def image_ref_problem(image: str) -> str | None:
    """Why ``image`` is no image reference (None: it is one)."""
    if IMAGE_REF.match(image):
        return None
    slip = hints.for_image(image, lambda fixed: bool(IMAGE_REF.match(fixed)))
    return f"image {short(image)} is not an image reference{slip or _IMAGE_FORM}"


def _image_ref(image: str) -> str:
    problem = image_ref_problem(image)
    if problem is not None:
        raise ValueError(problem)
    return image


_IMAGE_FORM = (
    ": [registry/]name[:tag][@sha256:<64 hex>], lower-case name (e.g. "
    "docker.io/vllm/vllm-openai:v0.11.0)"
)


def _volume(volume: str) -> str:
    parts = volume.split(":")
    mode_ok = len(parts) == 2 or (len(parts) == 3 and parts[2] in ("ro", "rw"))
    if not mode_ok or not all(parts[:2]):
        raise ValueError(f"volume {short(volume)} is not host:container[:ro]")
    for side, path in zip(("host", "container"), parts[:2], strict=True):
        if not path.startswith("/"):
            raise ValueError(f"volume {short(volume)}: the {side} path {path!r} must be absolute")
    return volume


def image_tag(image: str) -> str | None:
    """The tag of an image reference (None: none, only a digest or nothing)."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


class Container(Model):
    """Run the engine in a container (DESIGN.md "Engines in containers")."""

    image: Annotated[str, AfterValidator(_image_ref)] | None = Field(
        default=None,
        description="The image (default: the recipe's pinned image); `@sha256:...` pins a digest.",
    )
    runtime: ContainerRuntime | None = Field(
        default=None,
        description="podman or docker (default: node.yaml's containerRuntime, else podman "
        "if on PATH, else docker).",
    )
    pull_policy: PullPolicy | None = Field(
        default=None,
        description="Always, IfNotPresent or Never (default as Kubernetes: Always for "
        ":latest or no tag, else IfNotPresent).",
    )
    volumes: tuple[Annotated[str, AfterValidator(_volume)], ...] = Field(
        default=(), description="host:container[:ro] bind mounts, both paths absolute."
    )
    shm_size: ShmSize | None = Field(
        default=None, description="/dev/shm's size (e.g. 16Gi; default the runtime's)."
    )

    def policy(self, image: str) -> PullPolicy:
        """``pullPolicy``, else Kubernetes' default for ``image``."""
        if self.pull_policy is not None:
            return self.pull_policy
        if "@" in image:
            return "IfNotPresent"
        tag = image_tag(image)
        return "Always" if tag in (None, "latest") else "IfNotPresent"


class EnvFrom(Model):
    """One source of secret environment variables (DESIGN.md "Secrets"): exactly one key.

    Only the path is in the manifest; the values are read on the node, at the edge
    (controller/host/secrets.py), and reach the engine's environment alone.
    """

    file: str | None = Field(
        default=None,
        description="An absolute path on the node: KEY=VALUE lines (dotenv quoting), "
        "mode 0600 (readable by its owner only) or refused.",
    )
    sops_file: str | None = Field(
        default=None,
        description="A SOPS-encrypted dotenv file (age), relative to the manifest's folder "
        "and inside it; decrypted on the node by `sops -d` with its SOPS_AGE_KEY_FILE.",
    )

    @model_validator(mode="after")
    def _one(self) -> Self:
        if (self.file is None) == (self.sops_file is None):
            raise ValueError(
                "give exactly one of file (on the node) or sopsFile (in the repository)"
            )
        if self.file is not None and not self.file.startswith("/"):
            raise ValueError(f"file {short(self.file)} must be an absolute path on the node")
        if self.sops_file is not None:
            _inside_folder(self.sops_file)
        return self


def _inside_folder(path: str) -> None:
    """A sopsFile stays in the manifests folder: the repository is the boundary."""
    if not path or path.startswith("/"):
        raise ValueError(
            f"sopsFile {short(path)} must be relative to the manifest (e.g. secrets/hf.env)"
        )
    if posixpath.normpath(path).split("/")[0] == "..":
        raise ValueError(f"sopsFile {short(path)} leaves the manifests folder (`..`)")


class DeploymentSpec(Model):
    engine: Engine = Field(
        description="The recipe: vllm, llama-cpp, sglang, tgi, ollama, or command (any argv)."
    )
    model: str | None = Field(
        default=None, description="For engine recipes: a hub id or an absolute local path."
    )
    executable: str | None = Field(
        default=None, description="The recipe's program; else it is found on PATH."
    )
    command: tuple[Template, ...] | None = Field(
        default=None,
        description="engine: command only: the argv, never run through a shell. "
        "Placeholders: {port} {host} {name} {model} {devices}, and {python}: the "
        "interpreter reconcile runs under (its venv, from cron or systemd too).",
    )
    args: tuple[Template, ...] = Field(
        default=(), description="Appended to the recipe's argv (placeholders allowed)."
    )
    env: Annotated[
        dict[EnvKey, Arg], BeforeValidator(without_fixed), AfterValidator(_env_names)
    ] = Field(
        default_factory=dict,
        description="Extra environment variables for the engine; not those reconcile sets "
        "from the placement (PORT, RECONCILE_NAME, RECONCILE_INSTANCE, CUDA_VISIBLE_DEVICES "
        "and the other device visibility variables).",
    )
    env_from: tuple[EnvFrom, ...] = Field(
        default=(),
        description="Secret environment variables read on the node: {file: /abs/path} "
        "(0600 dotenv) or {sopsFile: rel/path} (SOPS + age). `env` wins over these; a "
        "changed value restarts the engine; values never appear in any output.",
    )
    devices: Devices = Field(
        default=Devices(), description="The devices (GPUs) to lease for this engine."
    )
    host: Annotated[str, AfterValidator(_bind_address)] = Field(
        default="127.0.0.1", description="The address the engine binds (default 127.0.0.1)."
    )
    port: Port | None = Field(
        default=None,
        description="An exact port: the deployment waits, saying why, if anything holds it.",
    )
    base_port: Port | None = Field(
        default=None, description="The first port to try, scanning upward (default 8000)."
    )
    readiness: Readiness | None = Field(
        default=None, description="How and how long to wait for the engine to be ready."
    )
    liveness_probe: LivenessProbe | None = Field(
        default=None,
        description="Once Ready, restart the engine when this fails failureThreshold times "
        "in a row (a hung engine: process alive, nothing answered). Unset: the recipe's "
        "(GET /health for vllm, sglang, tgi, llama-cpp; GET / for ollama; none for command). "
        "Changing it needs no restart.",
    )
    restart_policy: RestartPolicy = Field(
        default="Always", description="Always, OnFailure or Never (default Always)."
    )
    stop_grace_period_seconds: Annotated[float, Field(ge=0, le=3600), NOT_BOOL] = Field(
        default=30.0,
        description="SIGTERM, then this long, then SIGKILL (default 30). "
        "Changing it needs no restart.",
    )
    # The gateway (docs/design.md "The gateway"): started on the first request, stopped idle.
    activation: Activation = Field(
        default="Always",
        description="Always (default), or OnDemand: Idle (nothing held) until the gateway "
        "gets a request for it, stopped again after idleTimeout without one.",
    )
    idle_timeout: Seconds = Field(
        default=DEFAULT_IDLE_TIMEOUT,
        description="OnDemand only: stopped (Idle) after this long without a request "
        "(30s, 10m, 1h; default 10m).",
    )
    strategy: Strategy = Field(
        default="Recreate",
        description="Recreate or RollingUpdate (default Recreate): how a spec change "
        "reaches the engines (RollingUpdate: the new one Ready before the old one stops).",
    )
    aliases: tuple[str, ...] = Field(
        default=(),
        description="More model names the gateway routes here, besides metadata.name and "
        "spec.model; an alias listed twice, or equal to another deployment's name, is an "
        "error (a spec.model or alias shared with another deployment's spec.model is a pool).",
    )
    node_selector: Labels = Field(
        default_factory=dict,
        description="Only nodes whose node.yaml labels hold every pair run this deployment "
        "(e.g. {gpu: h100}); the others ignore it entirely. With --backend ray: only Ray "
        "nodes whose labels (ray start --labels) hold every pair. Empty: every node.",
    )
    # Export only (`reconcile export`): the pod's image; no backend runs it (container_image).
    image: str | None = Field(
        default=None,
        min_length=1,
        description="`reconcile export` only: the container image (default: the recipe's "
        "pinned image; required for engine: command). Never restarts the engine.",
    )
    # DESIGN.md "Engines in containers": the same engine, lease and contract, in an image.
    container: Container | None = Field(
        default=None,
        description="Run the engine in a container ({} runs the recipe's pinned image): "
        "image, runtime, pullPolicy, volumes, shmSize.",
    )
    # Higher preempts strictly lower when devices run short (DESIGN: Memory and priority).
    priority: int = Field(
        default=0,
        ge=-PRIORITY_LIMIT,
        le=PRIORITY_LIMIT,
        strict=True,
        description="When devices run short, a deployment stops (preempts) those of strictly "
        "lower priority (default 0, from -1000000000 to 1000000000). "
        "Changing it needs no restart.",
    )

    # Model files pulled into the cache before the engine starts (DESIGN.md "Model files").
    source: Source | None = Field(
        default=None,
        description="Model files to pull before the engine starts: huggingFace {repo, "
        "revision, files} or url with sha256. {model} then names the local file or folder.",
    )

    replicas: Replicas = Field(
        default=1,
        description="How many engines run this spec, each its own lease (default 1; 0 keeps "
        "it declared with nothing running). With autoscale: the count to start from.",
    )
    autoscale: Autoscale | None = Field(
        default=None,
        description="The daemon picks the replica count between min and max from the "
        "gateway's requests in flight.",
    )
    affinity: Affinity | None = Field(
        default=None,
        description="none, session or prefix: session keeps requests with one session key "
        "(x-session-id, else the OpenAI user field) on one replica; prefix sends a prompt "
        "to the replica that served its beginning (its prefix cache holds it). Default: "
        "prefix for engines that cache prefixes (vllm, sglang, llama-cpp, tgi), else none.",
    )
    fallbacks: list[str] = Field(
        default_factory=list,
        description="Model names (of other deployments) a request goes to, the first that "
        "can take it, when this one cannot: none Ready within fallbackAfter, every instance "
        "ejected, or its concurrency limit reached.",
    )
    fallback_after: Seconds = Field(
        default=30.0,
        description="How long a request waits for a Ready instance before it goes to a "
        "fallback (30s, 1m; default 30s). Only with fallbacks.",
    )
    rolling_update: RollingUpdate | None = Field(
        default=None,
        description="With strategy RollingUpdate: maxSurge and maxUnavailable, as in Kubernetes.",
    )

    @field_validator("model")
    @classmethod
    def _model_absolute(cls, value: str | None) -> str | None:
        # A pass runs in no folder of the manifest's (cron, systemd, a git checkout on
        # each node), so a relative path would name a file beside the engine's runtime
        # dir, and a container would have no folder to mount: refused, as Kubernetes'
        # hostPath is, rather than resolved against a folder the reader must guess.
        if value is not None and (value.startswith(("./", "../", "~")) or value in (".", "..")):
            raise ValueError(
                f"{value!r} is a relative path, which reconcile does not resolve (the engine "
                "runs in a folder of the state dir): write the file's absolute path "
                "(/srv/models/x.gguf), or name it with spec.source to have it pulled"
            )
        return value

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        self._replicas_coherent()
        if self.port is not None and self.base_port is not None:
            raise ValueError("set port (exact) or basePort (scan upward), not both")
        if self.engine == "command" and not self.command:
            raise ValueError("engine 'command' needs spec.command: an argv list, never a shell")
        if self.engine != "command" and self.command:
            raise ValueError(
                f"spec.command is only for engine 'command', not {self.engine!r}: add flags "
                f"to the {self.engine} recipe's argv with spec.args, or set engine: command"
            )
        self._image_named()
        self._model_named()
        return self

    def _image_named(self) -> None:
        """A container of engine 'command' names its image: no recipe pins one for it, and
        ``spec.image`` is `reconcile export`'s alone (never run: outside the spec hash)."""
        if self.engine != "command" or self.container is None:
            return
        if self.container.image is None:
            also = " (spec.image is for `reconcile export` only)" if self.image else ""
            raise ValueError(
                "engine 'command' has no pinned image: set spec.container.image to an image "
                f"that holds spec.command[0]{also}"
            )

    def _model_named(self) -> None:
        """``{model}`` with no model to name expanded to "" (``vllm serve ""``)."""
        if self.model or self.source is not None:
            return
        for where, argv in (("command", self.command or ()), ("args", self.args)):
            if any("{model}" in a for a in argv):
                raise ValueError(
                    f"spec.{where} uses {{model}}, but the spec names no model: set "
                    "spec.model (or spec.source for files to pull)"
                )

    def _replicas_coherent(self) -> None:
        problem = self._scale_problem() or self._rolling_problem()
        if problem:
            raise ValueError(problem)

    def _scale_problem(self) -> str | None:
        many = self.replicas > 1 or self.autoscale is not None
        if many and self.port is not None:
            return "an exact spec.port holds one engine: use basePort with replicas or autoscale"
        if self.activation == "OnDemand" and (many or self.replicas == 0):
            return (
                "activation: OnDemand starts one engine on demand: for more (or none), use "
                "autoscale with min: 0 and max: the most replicas, without OnDemand"
            )
        scale = self.autoscale
        explicit = "replicas" in self.model_fields_set
        if scale is not None and explicit and not scale.min <= self.replicas <= scale.max:
            return (
                f"replicas ({self.replicas}) is outside autoscale's min..max "
                f"({scale.min}..{scale.max}): with autoscale it is the count to start from"
            )
        return None

    def _rolling_problem(self) -> str | None:
        rolling = self.rolling_update
        if rolling is None:
            return None
        if self.strategy != "RollingUpdate":
            return "spec.rollingUpdate needs strategy: RollingUpdate"
        if _is_zero(rolling.max_surge) and _is_zero(rolling.max_unavailable):
            return (
                "rollingUpdate: maxSurge and maxUnavailable cannot both be 0 "
                "(no replica could ever be replaced)"
            )
        return None

    @property
    def initial_replicas(self) -> int:
        """The count before any autoscaling: ``replicas``, or autoscale's min when unset."""
        scale = self.autoscale
        if scale is not None and "replicas" not in self.model_fields_set:
            return scale.min
        return self.replicas

    @property
    def process_port(self) -> int | None:
        """The port an engine process is asked to bind first (``port``, else ``basePort``);
        None in a container (its runtime binds for it) or for the default 8000."""
        return None if self.container is not None else (self.port or self.base_port)


def _is_zero(value: int | str) -> bool:
    return value in (0, "0%")


class Deployment(Model):
    api_version: Literal["reconcile/v1"] = Field(description="Always reconcile/v1.")
    kind: Literal["Deployment"] = Field(description="Always Deployment.")
    metadata: Metadata = Field(description="The deployment's name and labels.")
    spec: DeploymentSpec = Field(description="The desired state of one engine instance.")

    @property
    def name(self) -> str:
        return self.metadata.name


@dataclass(frozen=True, slots=True)
class Entry:
    """A valid deployment as loaded: where it came from and its spec hash."""

    deployment: Deployment
    source: str
    line: int
    hash: str
    # spec.envFrom's values, resolved on the node (controller/host/secrets.py): they reach
    # the engine's environment alone, so never in repr, equality or any document.
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    secret_digest: str = ""  # their keyed digest, which ``hash`` covers (with_secrets)
    # vLLM's --config file's digest (store/sources/engineconfig.py), which ``hash`` covers
    # (with_config): an edit of the file restarts the engine, as a changed secret does.
    config_digest: str = ""
    # The first key of llama.cpp's --api-key-file (store/sources/keyfile.py), which the
    # probes present, and the file's bytes (None: no file read here), which the pass
    # digests under the secrets key: never in repr, equality or any document.
    file_key: str = field(default="", repr=False, compare=False)
    key_file: bytes | None = field(default=None, repr=False, compare=False)
    # That digest, which ``hash`` covers (with_key_file); unkeyed in a preview before any
    # pass made the secrets key, so in no repr either.
    key_file_digest: str = field(default="", repr=False)
    # What a release before the secrets key recorded for the same values (see rekeyed).
    unkeyed_digest: str = field(default="", repr=False, compare=False)
    # `plan`'s without the node's age key: a sopsFile's values unread, so ``hash`` covers
    # no secrets and cannot be held against the record's beyond its spec (planned as if
    # the values, --config file and key file were unchanged: reconciler/run._as_recorded).
    secrets_unread: bool = False
    # The line of each field path in the document, as the loader read it: a check made
    # after loading (placement, export) points at the field, as a load error does.
    field_lines: Mapping[tuple[str | int, ...], int] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def name(self) -> str:
        return self.deployment.name

    def line_at(self, loc: Sequence[str | int]) -> int:
        """The line of ``loc`` (``("spec", "devices", "memory")``), else of its nearest
        ancestor written in the document (a defaulted field: its parent), else the
        document's first."""
        probe = tuple(loc)
        while probe:
            if probe in self.field_lines:
                return self.field_lines[probe]
            probe = probe[:-1]
        return self.line


def spec_document(spec: DeploymentSpec) -> dict[str, Any]:
    """The spec as the manifest spells it (camelCase), defaults included.

    Fields added after release are left out while at their default, so upgrading
    reconcile changes no spec hash and restarts no engine.
    """
    doc = spec.model_dump(mode="json", by_alias=True)
    if doc.get("priority") == 0:
        del doc["priority"]
    if spec.devices.memory_auto:
        doc["devices"]["memory"] = AUTO  # resolved or not, the spec says auto
    elif doc["devices"].get("memory") is None:
        del doc["devices"]["memory"]
    if doc.get("source") is None:
        del doc["source"]
    if not doc.get("nodeSelector"):
        del doc["nodeSelector"]
    if doc.get("container") is None:
        del doc["container"]
    if not doc.get("envFrom"):
        del doc["envFrom"]
    if doc.get("livenessProbe") is None:
        del doc["livenessProbe"]
    if isinstance(doc.get("readiness"), dict) and doc["readiness"].get("completion") is None:
        del doc["readiness"]["completion"]
    return doc


@functools.cache
def document_default(key: str) -> Any:
    """A top-level spec field's default as :func:`spec_document` writes it (``key`` as the
    manifest spells it): what a document an older reconcile wrote, before the field
    existed, stands for. Only compared, never handed out to change."""
    field = next(f for f in DeploymentSpec.model_fields.values() if f.alias == key)
    default = field.get_default(call_default_factory=True)
    kind = TypeAdapter[Any](field.annotation or Any)  # every field here is annotated
    return kind.dump_python(default, mode="json", by_alias=True)


def routable_names(name: str, spec: DeploymentSpec) -> tuple[str, ...]:
    """The model names the gateway routes to a deployment: its name, model and aliases."""
    return model_names(name, spec.model, spec.aliases)


def spec_hash(spec: DeploymentSpec) -> str:
    """Identity of what runs: labels, metadata and the NOT_HASHED fields never restart."""
    return document_hash(spec_document(spec))


def document_hash(document: dict[str, Any]) -> str:
    """:func:`spec_hash` of a spec document (a record's ``stored_spec``)."""
    hashed = {k: v for k, v in document.items() if k not in NOT_HASHED}
    canonical = json.dumps(hashed, sort_keys=True, separators=(",", ":"))
    return "sha256:" + sha256_hex(canonical.encode())


def with_config(hash_: str, config_digest: str) -> str:
    """A spec hash that also covers vLLM's --config file (its digest; none: the hash)."""
    if not config_digest:
        return hash_
    return "sha256:" + sha256_hex(f"{hash_}|config|{config_digest}".encode())


def with_key_file(hash_: str, key_file_digest: str) -> str:
    """A spec hash that also covers llama.cpp's --api-key-file (its keyed digest; none:
    the hash)."""
    if not key_file_digest:
        return hash_
    return "sha256:" + sha256_hex(f"{hash_}|key-file|{key_file_digest}".encode())


def with_secrets(hash_: str, secret_digest: str) -> str:
    """A spec hash that also covers envFrom's values (their digest, never the values)."""
    return "sha256:" + sha256_hex(f"{hash_}|{secret_digest}".encode())


def changed_fields(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths whose values differ between two spec documents."""
    out: list[str] = []
    for key in sorted(set(old) | set(new)):
        if not prefix and key in NOT_HASHED:
            continue  # never a reason to touch an engine (see NOT_HASHED)
        a, b = old.get(key), new.get(key)
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(changed_fields(a, b, path + "."))
        elif a != b:
            out.append(path)
    return out


def expand(template: str, values: dict[str, str]) -> str:
    """Replace the known ``{placeholders}``; leave any other braces alone (JSON args)."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def json_schema() -> dict[str, Any]:
    """The models' own JSON Schema, each field's description included (editors' hover help).

    ``reconcile schema`` prints it; ``schema/deployment.schema.json`` is the same text
    (a test keeps them equal), referenced from each manifest's first line::

        # yaml-language-server: $schema=../schema/deployment.schema.json
    """
    schema = Deployment.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "reconcile Deployment"
    return schema


def fields_at(path: tuple[str | int, ...]) -> tuple[str, ...]:
    """The field names (as the manifest spells them) a mapping at ``path`` may hold.

    ``("spec", "readiness")`` -> ``("httpGet", "tcpSocket", ...)``; an unknown path or a
    free-form mapping (``env``, ``labels``) holds no known names: ``()``.
    """
    return fields_in(_schema(), path)


def fields_in(schema: dict[str, Any], path: tuple[str | int, ...]) -> tuple[str, ...]:
    """``fields_at`` for any model's JSON Schema (by alias): node.yaml's too. A list's index
    steps into its items (``envFrom[0]`` holds ``file``, ``sopsFile``)."""
    node: dict[str, Any] = schema
    for part in path:
        key = "items" if isinstance(part, int) else "properties"
        inner = _resolve(schema, node).get(key, {})
        node = inner if isinstance(part, int) else inner.get(part, {})
    return tuple(_resolve(schema, node).get("properties", {}))


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """Follow a ``$ref`` and the one object branch of an ``anyOf`` (an optional field)."""
    ref = node.get("$ref")
    if isinstance(ref, str):
        node = schema["$defs"][ref.rsplit("/", 1)[-1]]
    for branch in node.get("anyOf", ()):
        if "$ref" in branch or "properties" in branch:
            return _resolve(schema, branch)
    return node


@functools.cache
def _schema() -> dict[str, Any]:
    return json_schema()  # built on the first unknown field only: errors are rare
