"""The node config file: this machine's limits and log rotation, beside the flags.

``--node-config FILE`` / ``RECONCILE_NODE_CONFIG``, else ``<state-dir>/node.yaml``
when it exists::

    maxInstances: 8                  # every deployment on this node, whoever owns it
    maxInstancesPerKind: {nvidia: 2}  # instances holding devices of that kind
    logMaxBytes: 10485760            # rotate an engine's log past this size
    logMaxFiles: 3                   # backups kept (<name>.log.1 ... .3)
    containerRuntime: docker         # spec.container's default runtime (else podman if on PATH)

Flags win over the file (``--max-instances 8,nvidia=2``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from controller.core.limits import Limits
from controller.core.specerrors import problems
from controller.core.specs import NOT_BOOL, ContainerRuntime
from controller.errors import ConfigError
from controller.store import logfiles
from controller.store.yamlread import field_path, line_for, load_mapping

Kind = Literal["nvidia", "amd", "apple", "cpu"]
Int = Annotated[int, NOT_BOOL]  # 8 or "8", never `yes`


class NodeFile(BaseModel):
    """``node.yaml``: camelCase keys, no unknown setting, numbers as the manifests take them."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )

    max_instances: Int | None = Field(default=None, ge=0)
    max_instances_per_kind: dict[Kind, Int] = Field(default_factory=dict)
    log_max_bytes: Int = Field(default=logfiles.DEFAULT_MAX_BYTES, ge=1024)
    log_max_files: Int = Field(default=logfiles.DEFAULT_KEEP, ge=0, le=100)
    container_runtime: ContainerRuntime | None = None

    @property
    def limits(self) -> Limits:
        return Limits(
            self.max_instances, {str(k): v for k, v in self.max_instances_per_kind.items()}
        )


def read_node_file(explicit: str | None, state_dir: Path) -> NodeFile:
    """The node config: the named file (which must exist), the state dir's, or defaults."""
    path = Path(explicit).expanduser() if explicit else state_dir / "node.yaml"
    if not explicit and not path.exists():
        return NodeFile()
    try:
        value, lines = load_mapping(path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        return NodeFile.model_validate(value)
    except ValidationError as exc:
        first = problems(exc, value)[0]
        loc, message = first.loc, first.message
        line = line_for(lines, loc)
        where = f"{path}:{line}" if line else str(path)
        if first.unknown:
            message = (
                "unknown setting (maxInstances, maxInstancesPerKind, logMaxBytes, logMaxFiles, "
                "containerRuntime)"
            )
        raise ConfigError(f"{where}: {field_path(loc)}: {message}") from exc
