"""The node config file: this machine's limits and log rotation, beside the flags.

``--node-config FILE`` / ``RECONCILE_NODE_CONFIG``, else ``<state-dir>/node.yaml``
when it exists::

    maxInstances: 8                  # every deployment on this node, whoever owns it
    maxInstancesPerKind: {nvidia: 2}  # instances holding devices of that kind
    logMaxBytes: 10485760            # rotate an engine's log past this size
    logMaxFiles: 3                   # backups kept (<name>.log.1 ... .3)

Flags win over the file (``--max-instances 8,nvidia=2``).
"""

from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from controller.core.frozen import frozen
from controller.core.limits import Limits
from controller.core.values import Rule, Value, ValueInvalid
from controller.errors import ConfigError
from controller.store import logfiles
from controller.store.yamlread import field_path, line_for, load_mapping

Kind = Literal["nvidia", "amd", "apple", "cpu"]


@frozen(kw_only=True, slots=True)
class NodeFile(Value):
    CAMEL: ClassVar[bool] = True
    LAX: ClassVar[bool] = True

    max_instances: Annotated[int, Rule(ge=0)] | None = None
    max_instances_per_kind: dict[Kind, int] = field(default_factory=dict)
    log_max_bytes: Annotated[int, Rule(ge=1024)] = logfiles.DEFAULT_MAX_BYTES
    log_max_files: Annotated[int, Rule(ge=0, le=100)] = logfiles.DEFAULT_KEEP

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
    except ValueInvalid as exc:
        loc, message = exc.loc, exc.msg
        line = line_for(lines, loc)
        where = f"{path}:{line}" if line else str(path)
        if message == "Extra inputs are not permitted":
            message = (
                "unknown setting (maxInstances, maxInstancesPerKind, logMaxBytes, logMaxFiles)"
            )
        raise ConfigError(f"{where}: {field_path(loc)}: {message}") from exc
