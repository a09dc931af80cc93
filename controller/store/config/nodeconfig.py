"""The node config file: this machine's limits and log rotation, beside the flags.

``--node-config FILE`` / ``RECONCILE_NODE_CONFIG``, else ``<state-dir>/node.yaml``
when it exists::

    maxInstances: 8                  # every deployment on this node, whoever owns it
    maxInstancesPerKind: {nvidia: 2}  # instances holding devices of that kind
    logMaxBytes: 10485760            # rotate an engine's log past this size
    logMaxFiles: 3                   # backups kept (<name>.log.1 ... .3)
    tlsCert: /etc/reconcile/cert.pem  # the gateway's HTTPS pair (--tls-cert, --tls-key);
    tlsKey: /etc/reconcile/key.pem    #   a relative path is from this file's folder
    git:                             # follow a repository (store/sources/git/source.py)
      url: https://example.com/ops.git
      branch: main                   # or tag: v1.2
      path: manifests
      interval: 1m
      timeout: 60s                   # one fetch's limit (a remote that hangs holds a pass)
      webhookSecretFile: /etc/reconcile/hook.secret
      verify: {allowedSigners: /etc/reconcile/allowed_signers}
      autoRollback: {progressDeadline: 10m}
    containerRuntime: docker         # spec.container's default runtime (else podman if on PATH)
    labels: {gpu: h100, site: lab2}  # this node's share of a fleet: spec.nodeSelector matches them
    notify:                          # JSON POSTs for these events (store/instances/outbox.py)
      - url: https://hooks.example.com/reconcile
        events: [Failed, BackOff, RolledBack, PullFailed, Synced]

Flags win over the file (``--max-instances 8,nvidia=2``; ``--git``, ``--branch``... one
key at a time), then the environment.
"""

from __future__ import annotations

from difflib import get_close_matches
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.alias_generators import to_camel

from controller.core.devices.capacity import Limits
from controller.core.manifest.excerpt import did_you_mean
from controller.core.manifest.labels import Labels
from controller.core.manifest.quantity import parse_duration
from controller.core.manifest.specerrors import Problem, problems
from controller.core.manifest.specs import NOT_BOOL, ContainerRuntime, fields_in
from controller.errors import ConfigError
from controller.store.instances import logfiles, outbox
from controller.store.sources.yamlread import Path_, field_path, line_for, load_mapping
from controller.store.statedir import StateDir

Kind = Literal["nvidia", "amd", "apple", "cpu"]
Int = Annotated[int, NOT_BOOL]  # 8 or "8", never `yes`


class VerifyFile(BaseModel):
    """``git.verify``: commits must be signed by a key in git's ssh allowed_signers file."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )

    allowed_signers: str


def _duration(value: str | float | None) -> str | float | None:
    """A length of time as people write it (``1m``, ``90s``, or seconds), above zero:
    checked with the file's other settings, so its error names node.yaml's line."""
    if value is None:
        return None
    if parse_duration(str(value)) <= 0:  # its own error names the value and examples
        shown = f"{value:g}" if isinstance(value, float) else repr(value)
        raise ValueError(f"{shown} is no length of time: give one above 0 (e.g. 1m, 90s)")
    return value


class AutoRollbackFile(BaseModel):
    """``git.autoRollback``: a commit not all Ready by the deadline is rolled back."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )

    progress_deadline: str | float  # 10m, or seconds

    _deadline = field_validator("progress_deadline")(_duration)


class GitFile(BaseModel):
    """``git:``: the repository this node follows (the flags override each key)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )

    url: str | None = None
    branch: str | None = None
    tag: str | None = None
    path: str | None = None
    interval: str | float | None = None  # 1m, 30s, or seconds
    timeout: str | float | None = None  # one fetch's limit: 60s, 2m, or seconds
    webhook_secret_file: str | None = None
    verify: VerifyFile | None = None
    auto_rollback: AutoRollbackFile | None = None

    _interval = field_validator("interval", "timeout")(_duration)

    # Checked here, not only with the flags: the error then names node.yaml's line.
    @field_validator("url")
    @classmethod
    def _given(cls, url: str | None) -> str | None:
        # `url: ${OPS_REPO}` templated with the variable unset: read as no url, the node
        # ran the remembered source, or ./manifests, with no word (an empty --git is 64)
        if url is None or not url.strip():
            raise ValueError(
                "the repository URL is empty (a variable unset where this file was made?):"
                " give it, or drop the key to follow --git's URL"
            )
        return url

    @field_validator("tag")
    @classmethod
    def _one_ref(cls, tag: str | None, info: ValidationInfo) -> str | None:
        if tag and info.data.get("branch"):
            raise ValueError("give a branch or a tag, not both: drop one of the two keys")
        return tag

    @field_validator("path")
    @classmethod
    def _inside(cls, path: str | None) -> str | None:
        from controller.store.sources.git.source import normal_path

        if path is not None:
            try:
                normal_path(path)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return path


class NotifyFile(BaseModel):
    """One ``notify:`` item: where to POST, and which events."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    events: list[str] = Field(min_length=1)

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "an http:// or https:// URL with a host (e.g. https://hooks.example.com/x)"
            )
        return url

    @field_validator("events")
    @classmethod
    def _events(cls, events: list[str]) -> list[str]:
        for event in events:
            if event not in outbox.EVENTS:
                close = get_close_matches(event, outbox.EVENTS, 1, 0.6)
                hint = f"did you mean {close[0]}? " if close else ""
                raise ValueError(
                    f"unknown event {event!r}: {hint}one of {', '.join(outbox.EVENTS)}"
                )
        return events

    @property
    def hook(self) -> outbox.Hook:
        return outbox.Hook(self.url, frozenset(self.events))


class NodeFile(BaseModel):
    """``node.yaml``: camelCase keys, no unknown setting, numbers as the manifests take them."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )

    max_instances: Int | None = Field(default=None, ge=0)
    max_instances_per_kind: dict[Kind, Int] = Field(default_factory=dict)
    log_max_bytes: Int = Field(default=logfiles.DEFAULT_MAX_BYTES, ge=1024)
    log_max_files: Int = Field(default=logfiles.DEFAULT_KEEP, ge=0, le=100)
    tls_cert: str | None = Field(default=None, min_length=1)
    tls_key: str | None = Field(default=None, min_length=1)
    _folder: Path = PrivateAttr(default=Path("."))  # the file's: relative paths start there

    def git_here(self) -> GitFile | None:
        """``git:`` with a repository given as a relative path taken from this file's
        folder, as tlsCert's is (the node's git runs in its checkout, elsewhere)."""
        if self.git is None or not self.git.url:
            return self.git
        from controller.store.sources.git.source import local_repo

        return self.git.model_copy(update={"url": local_repo(self.git.url, self._folder)})

    def tls_path(self, name: str) -> Path | None:
        value: str | None = getattr(self, name)
        return (self._folder / Path(value).expanduser()).absolute() if value else None

    git: GitFile | None = None
    container_runtime: ContainerRuntime | None = None
    labels: Labels = Field(default_factory=dict)
    notify: list[NotifyFile] = Field(default_factory=list)

    @property
    def limits(self) -> Limits:
        return Limits(
            self.max_instances, {str(k): v for k, v in self.max_instances_per_kind.items()}
        )


def read_node_file(explicit: str | None, state_dir: Path) -> NodeFile:
    """The node config: the named file (which must exist), the state dir's, or defaults."""
    path = Path(explicit).expanduser() if explicit else StateDir(state_dir).node_config
    if not explicit and not path.exists():
        return NodeFile()
    try:
        value, lines = load_mapping(path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    try:
        found = NodeFile.model_validate(value)
    except ValidationError as exc:
        said = [_said(path, lines, problem) for problem in problems(exc, value)]
        raise ConfigError("; ".join(said)) from exc
    found._folder = path.parent.absolute()
    return found


def setting_at(path: Path, name: str) -> str:
    """``path:LINE`` of the top-level setting ``name`` (``tlsKey``), as the file's own errors
    name theirs; ``path`` alone when the file or that setting cannot be read now."""
    try:
        _, lines = load_mapping(path)
    except ValueError:  # unreadable or broken since it was read: its own error says so
        return str(path)
    line = lines.get((name,))
    return f"{path}:{line}" if line else str(path)


def _said(path: Path, lines: dict[Path_, int], problem: Problem) -> str:
    """One problem of the file, where it is; an unknown setting with the one meant, else
    the settings its mapping may hold."""
    line = line_for(lines, problem.loc)
    where = f"{path}:{line}" if line else str(path)
    message = problem.message
    if problem.unknown:
        known = fields_in(NodeFile.model_json_schema(by_alias=True), problem.loc[:-1])
        meant = did_you_mean(str(problem.loc[-1]), known)
        message = (
            f"unknown setting: did you mean `{meant}`?"
            if meant
            else f"unknown setting (here: {', '.join(known)})"
        )
    return f"{where}: {field_path(problem.loc)}: {message}"
