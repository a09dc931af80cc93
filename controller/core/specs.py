"""The Deployment manifest as frozen values (no I/O), checked by core/values.py.

The manifest uses Kubernetes' camelCase; Python code uses snake_case (``CAMEL``).
Unknown fields are errors everywhere. Numbers written as strings are taken, as
they always were (``LAX``).
"""

from __future__ import annotations

import json
import re
from dataclasses import field
from typing import Annotated, Any, ClassVar, Literal

from controller.core.digest import sha256_hex
from controller.core.frozen import frozen

# re-exported: their home is core.names, which records import without the specs
from controller.core.names import DNS1123 as DNS1123
from controller.core.names import NEXT_SUFFIX as NEXT_SUFFIX
from controller.core.names import base_name as base_name
from controller.core.names import is_dns1123 as is_dns1123
from controller.core.names import is_next as is_next
from controller.core.names import next_name as next_name
from controller.core.quantity import parse_quantity
from controller.core.values import Rule, Value, ValueInvalid

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PLACEHOLDER = re.compile(r"\{(port|host|name|model|devices)\}")

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
NOT_HASHED = frozenset({"image", "activation", "idleTimeout", "strategy", "aliases"})


def _scalar_to_str(value: Any) -> Any:
    """YAML reads `8192` as an int; argv and env values are strings, so accept numbers."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _duration(value: Any) -> Any:
    """``idleTimeout: 10m`` (or plain seconds) -> seconds."""
    if isinstance(value, str):
        from controller.core.durations import parse_duration

        return parse_duration(value)
    return value


def _dns1123(name: str) -> str:
    if not is_dns1123(name):
        raise ValueError(
            f"name {name!r} is not a DNS-1123 label: lower-case letters, digits "
            "and '-', starting and ending with a letter or digit, at most 63 characters"
        )
    if is_next(name):
        raise ValueError(
            f"name {name!r} ends with {NEXT_SUFFIX!r}, which reconcile reserves for the "
            "new instance of a RollingUpdate: choose another name"
        )
    return name


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"httpGet.path {path!r} must start with '/'")
    return path


def _env_names(env: dict[str, str]) -> dict[str, str]:
    for key in env:
        if not ENV_NAME.match(key):
            raise ValueError(f"env name {key!r} is not a valid environment variable name")
    return env


NUMBER_OR_STRING = {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "number"}]}
# The schema says what the loader takes: numbers too (YAML reads `8192` as an int).
Arg = Annotated[str, Rule(before=_scalar_to_str, accepts=NUMBER_OR_STRING)]
Port = Annotated[int, Rule(ge=1, le=65535)]
Seconds = Annotated[
    float,
    Rule(
        before=_duration,
        gt=0,
        le=30 * 86400,
        accepts={"anyOf": [{"type": "string"}, {"type": "number"}]},
    ),
]
# Kubernetes-style quantity (`20Gi`) kept as whole bytes; the schema shows what users write.
Memory = Annotated[
    int, Rule(before=parse_quantity, accepts={"anyOf": [{"type": "string"}, {"type": "integer"}]})
]
PRIORITY_LIMIT = 1_000_000_000  # Kubernetes' user PriorityClass range, both ways


class Model(Value):
    __slots__ = ()
    CAMEL: ClassVar[bool] = True
    LAX: ClassVar[bool] = True


@frozen(kw_only=True, slots=True)
class Metadata(Model):
    name: Annotated[str, Rule(max_length=63, check=_dns1123)]
    labels: dict[str, str] = field(default_factory=dict)


@frozen(kw_only=True, slots=True)
class Devices(Model):
    count: Annotated[int, Rule(ge=0, le=64)] = 0
    kind: DeviceKind = "any"
    candidates: tuple[Arg, ...] | None = None
    shareable: bool = False
    # Memory on EACH of the `count` devices; set, devices are shared and packed by memory.
    memory: Memory | None = None

    def __post_init__(self) -> None:
        if self.memory is not None and self.count == 0:
            raise ValueInvalid(
                (),
                "devices.memory is the share of each device, but devices.count is 0: "
                "set devices.count (at least 1) or drop devices.memory",
            )


@frozen(kw_only=True, slots=True)
class HttpGet(Model):
    path: Annotated[str, Rule(check=_absolute)] = "/health"


@frozen(kw_only=True, slots=True)
class TcpSocket(Model):
    pass


@frozen(kw_only=True, slots=True)
class Readiness(Model):
    http_get: HttpGet | None = None
    tcp_socket: TcpSocket | None = None
    deadline_seconds: Annotated[float, Rule(gt=0, le=7 * 86400)] | None = None
    period_seconds: Annotated[float, Rule(ge=0.1, le=3600)] = 2.0

    def __post_init__(self) -> None:
        if self.http_get is not None and self.tcp_socket is not None:
            raise ValueInvalid((), "readiness takes httpGet or tcpSocket, not both")


@frozen(kw_only=True, slots=True)
class DeploymentSpec(Model):
    engine: Engine
    model: str | None = None
    executable: str | None = None
    command: tuple[Arg, ...] | None = None
    args: tuple[Arg, ...] = ()
    env: Annotated[dict[str, Arg], Rule(check=_env_names)] = field(default_factory=dict)
    devices: Devices = Devices()
    host: str = "127.0.0.1"
    port: Port | None = None
    base_port: Port | None = None
    readiness: Readiness | None = None
    restart_policy: RestartPolicy = "Always"
    stop_grace_period_seconds: Annotated[float, Rule(ge=0, le=3600)] = 30.0
    # The gateway (docs/design.md "The gateway"): started on the first request, stopped idle.
    activation: Activation = "Always"
    idle_timeout: Seconds = DEFAULT_IDLE_TIMEOUT
    strategy: Strategy = "Recreate"
    aliases: tuple[str, ...] = ()
    # Export only (`reconcile export`): the container image; local and Ray backends ignore it.
    image: Annotated[str, Rule(min_length=1)] | None = None
    # Higher preempts strictly lower when devices run short (DESIGN: Memory and priority).
    priority: Annotated[int, Rule(ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT, strict=True)] = 0

    def __post_init__(self) -> None:
        if self.port is not None and self.base_port is not None:
            raise ValueInvalid((), "set port (exact) or basePort (scan upward), not both")
        if self.engine == "command" and not self.command:
            raise ValueInvalid(
                (), "engine 'command' needs spec.command: an argv list, never a shell"
            )
        if self.engine != "command" and self.command:
            raise ValueInvalid(
                (), f"spec.command is only for engine 'command', not {self.engine!r}"
            )


@frozen(kw_only=True, slots=True)
class Deployment(Model):
    api_version: Literal["reconcile/v1"]
    kind: Literal["Deployment"]
    metadata: Metadata
    spec: DeploymentSpec

    @property
    def name(self) -> str:
        return self.metadata.name


@frozen
class Entry:
    """A valid deployment as loaded: where it came from and its spec hash."""

    deployment: Deployment
    source: str
    line: int
    hash: str

    @property
    def name(self) -> str:
        return self.deployment.name


def spec_document(spec: DeploymentSpec) -> dict[str, Any]:
    """The spec as the manifest spells it (camelCase), defaults included.

    Fields added after release are left out while at their default, so upgrading
    reconcile changes no spec hash and restarts no engine.
    """
    doc = spec.model_dump(by_alias=True)
    if doc.get("priority") == 0:
        del doc["priority"]
    if doc["devices"].get("memory") is None:
        del doc["devices"]["memory"]
    return doc


def routable_names(name: str, spec: DeploymentSpec | dict[str, Any]) -> tuple[str, ...]:
    """The model names the gateway routes to a deployment: its name, model and aliases."""
    if isinstance(spec, DeploymentSpec):
        model, aliases = spec.model, list(spec.aliases)
    else:
        model, aliases = spec.get("model"), list(spec.get("aliases") or ())
    out = [name, *([model] if isinstance(model, str) else []), *map(str, aliases)]
    return tuple(dict.fromkeys(out))


def spec_hash(spec: DeploymentSpec) -> str:
    """Identity of what runs: labels, metadata and the NOT_HASHED fields never restart."""
    document = {k: v for k, v in spec_document(spec).items() if k not in NOT_HASHED}
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return "sha256:" + sha256_hex(canonical.encode())


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
    from controller.core.valueschema import schema_of

    schema = schema_of(Deployment)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "reconcile Deployment"
    return schema
