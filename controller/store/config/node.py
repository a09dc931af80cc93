"""Node configuration (flags > environment > defaults) and the durable drain flag."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from controller.core.devices.capacity import Limits, parse_limits
from controller.core.manifest import backendnames
from controller.core.state import Drain
from controller.errors import ConfigError
from controller.store import bootstamp
from controller.store.config import nodelabels
from controller.store.documents import write_atomic
from controller.store.instances import logfiles
from controller.store.sources.nearmiss import SUFFIXES
from controller.store.statedir import StateDir

# Types only: pydantic is imported only when a node.yaml is read, and the git source
# (subprocess) and the outbox (hashlib, uuid) only where they are used, so `status`,
# which resolves a Config, pays for none of them.
if TYPE_CHECKING:
    from controller.store.config.nodeconfig import GitFile
    from controller.store.instances.outbox import Hook
    from controller.store.sources.git.source import GitSettings

DEFAULT_LOCK_TIMEOUT = 60.0  # seconds a pass waits for another's lock


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    manifests: tuple[Path, ...]
    state_dir: Path
    node: str
    devices: str | None  # a static inventory, or None to discover
    owner: str
    allow_empty: bool = False
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    insecure_manifests: bool = False  # as root, load manifests others can write (security.py)
    limits: Limits = field(default_factory=Limits)
    log_max_bytes: int = logfiles.DEFAULT_MAX_BYTES
    log_keep: int = logfiles.DEFAULT_KEEP
    metrics_file: Path | None = None  # a Prometheus textfile written after each pass
    metrics_port: int | None = None  # the daemon serves /metrics here
    backend: str = "local"  # where engines run: "local" (this node) or "ray" (a Ray cluster)
    ray_address: str | None = None  # the Ray cluster (GCS host:port or "auto"), with "ray"
    tls_cert: Path | None = None  # node.yaml's tlsCert (the flag and environment win)
    tls_key: Path | None = None
    git: GitSettings | None = None  # --git / node.yaml git: the manifests are its checkout
    # node.yaml's containerRuntime: what a spec.container without a runtime runs under
    # (None: podman if on PATH, else docker).
    container_runtime: str | None = None
    # node.yaml's labels: the deployments whose spec.nodeSelector they match run here.
    # None: the node config could not be read (a lenient resolve): the share is unknown,
    # so nothing is started or pruned by a selector.
    labels: dict[str, str] | None = field(default_factory=dict)
    notify: tuple[Hook, ...] = ()  # node.yaml's notify: where to POST which events
    # What a lenient resolve (a read verb) passed over: each names the file, line, problem.
    warnings: tuple[str, ...] = ()
    # The node.yaml ``labels`` were read in now (None: none read): a pass remembers them,
    # kept while the file goes missing (``config/nodelabels.py``).
    labels_file: Path | None = None

    @property
    def repo(self) -> Path | None:
        """The git source's checkout the manifests are in (None: the node's own folders):
        what their errors name files from (``manifests.load``)."""
        return StateDir(self.state_dir).git_checkout if self.git is not None else None


BACKENDS = backendnames.NAMES


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/reconcile")
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "reconcile"


def given_state_dir(flag: str | None) -> Path | None:
    """The state dir ``--state-dir`` or ``RECONCILE_STATE_DIR`` names; None: the default."""
    state = flag or os.environ.get("RECONCILE_STATE_DIR")
    return Path(state).expanduser().absolute() if state else None


def state_dir_denied(flag: str | None, denied: str | None) -> str | None:
    """What a user who is not root, refused ``denied`` (EACCES, EPERM), may not do with
    its state dir, and the next move; None when ``denied`` is not on the state dir's way
    or the state dir is this user's (a file's own mode is then the matter)."""
    given = given_state_dir(flag)
    state = given or default_state_dir()
    if os.geteuid() == 0 or denied is None:
        return None
    where = Path(denied).absolute()
    if where != state and state not in where.parents and where not in state.parents:
        return None
    try:
        uid = state.stat().st_uid
    except OSError:  # not there, or a folder on its way this user may not enter
        how = "--state-dir DIR (RECONCILE_STATE_DIR)"
        if given is None:
            how += " or XDG_STATE_HOME: the default, for a user who is not root, is"
            how += " $XDG_STATE_HOME/reconcile, else ~/.local/state/reconcile"
        who = f"this user (uid {os.geteuid()})"
        return (
            f"{who} may not create or reach the state dir {state}: name one it may write with {how}"
        )
    if uid == os.geteuid():
        return None
    return (
        f"the state dir {state} belongs to {_user_name(uid)}, and a state dir is one user's"
        " alone (0700): run reconcile as that user (users who share GPUs share one reconcile:"
        ' README, "A shared GPU box"), or give this one its own with --state-dir DIR (two'
        " state dirs on one box do not see each other's engines and hand out the same GPUs)"
    )


def _user_name(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def resolve(
    *,
    manifests: list[str] | None = None,
    state_dir: str | None = None,
    node: str | None = None,
    devices: str | None = None,
    owner: str | None = None,
    allow_empty: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    insecure_manifests: bool = False,
    max_instances: str | None = None,
    node_config: str | None = None,
    metrics_file: str | None = None,
    metrics_port: int | None = None,
    backend: str | None = None,
    ray_address: str | None = None,
    git: GitFlags | None = None,
    lenient: bool = False,
) -> Config:
    """``lenient``: a node config file that cannot be read is a warning (its settings
    are left at their defaults), not an error: a read verb must still show the node."""
    env = os.environ
    state_path = given_state_dir(state_dir) or default_state_dir()
    folders = manifests or _split(env.get("RECONCILE_MANIFESTS")) or ["./manifests"]
    # `-f m -f m` is the set `-f m` made: one folder named twice must not derive another owner
    paths = tuple(dict.fromkeys(Path(f).expanduser().absolute() for f in folders))
    node_name = node or env.get("RECONCILE_NODE") or socket.gethostname() or "localhost"
    if "/" in node_name:
        raise ConfigError(f"node name {node_name!r} may not contain '/'")
    read = _node_file(node_config or env.get("RECONCILE_NODE_CONFIG"), state_path, lenient)
    limits, git_file = read.limits, read.git
    flag = max_instances if max_instances is not None else env.get("RECONCILE_MAX_INSTANCES")
    if flag:
        try:
            limits = limits.merged(parse_limits(flag))
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    chosen, address = resolve_backend(backend, ray_address)
    flags = git or GitFlags()
    if manifests and flags.url:
        raise ConfigError(
            "-f and --git are one or the other: a node follows a repository or reads"
            " folders; drop one"
        )
    if not (
        manifests or env.get("RECONCILE_MANIFESTS") or flags.url or (git_file and git_file.url)
    ):
        # the state dir remembers the source it follows (a read verb goes on without it)
        flags = remembered(state_path, flags, strict=not lenient)
    # -f on the command line wins over node.yaml's git: (a `validate -f` on the node works)
    source = None if manifests else git_source(flags, git_file)
    if source is not None:
        from controller.store.sources.git.source import manifests_dir

        paths = (manifests_dir(state_path, source.path),)
        if owner:  # what `source` and `status` judge the source by: the records' owner
            source = replace(source, owned_as=owner)
        else:  # the same repository spelled otherwise: the owner its records carry
            from controller.store.sources.git.source import spelled_as_before

            source = spelled_as_before(state_path, source, lambda: _owners(state_path))
    return Config(
        manifests=paths,
        state_dir=state_path,
        node=node_name,
        devices=devices if devices is not None else env.get("RECONCILE_DEVICES"),
        owner=owner or (source.owner if source else set_name(paths)),
        allow_empty=allow_empty,
        lock_timeout=lock_timeout,
        insecure_manifests=insecure_manifests,
        limits=limits,
        log_max_bytes=read.log_max_bytes,
        log_keep=read.log_keep,
        metrics_file=Path(metrics_file).expanduser().absolute() if metrics_file else None,
        metrics_port=metrics_port,
        backend=chosen,
        ray_address=address,
        container_runtime=read.container_runtime,
        labels=read.labels,
        labels_file=read.read_from,
        notify=read.hooks,
        warnings=read.warnings,
        tls_cert=read.tls[0],
        tls_key=read.tls[1],
        git=source,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _FileSettings:
    """What node.yaml says (the defaults where there is none)."""

    limits: Limits = field(default_factory=Limits)
    log_max_bytes: int = logfiles.DEFAULT_MAX_BYTES
    log_keep: int = logfiles.DEFAULT_KEEP
    tls: tuple[Path | None, Path | None] = (None, None)
    git: GitFile | None = None
    container_runtime: str | None = None
    # None: the file could not be read (a lenient resolve): the node's share is unknown
    labels: dict[str, str] | None = field(default_factory=dict)
    hooks: tuple[Hook, ...] = ()
    warnings: tuple[str, ...] = ()
    read_from: Path | None = None  # the node.yaml its labels were read in (None: none read)


# What a lenient resolve adds to an unreadable node config's error (`plan` strips it).
IGNORED = " (the node config's settings are ignored here)"


def _node_file(explicit: str | None, state_path: Path, lenient: bool) -> _FileSettings:
    """node.yaml's settings; pydantic and yaml are imported only when the file exists."""
    default = StateDir(state_path).node_config
    if not (explicit or default.exists()):
        return _gone(state_path, default)
    from controller.store.config.nodeconfig import read_node_file

    try:
        node_file = read_node_file(explicit, state_path)
    except ConfigError as exc:
        if not lenient:
            raise
        warning = f"{exc}{IGNORED}"
        return _FileSettings(labels=None, warnings=(warning,))
    return _FileSettings(
        limits=node_file.limits,
        log_max_bytes=node_file.log_max_bytes,
        log_keep=node_file.log_max_files,
        tls=(node_file.tls_path("tls_cert"), node_file.tls_path("tls_key")),
        git=node_file.git_here(),
        container_runtime=node_file.container_runtime,
        labels=dict(node_file.labels),
        hooks=tuple(item.hook for item in node_file.notify),
        read_from=Path(explicit).expanduser().absolute() if explicit else default,
    )


def _gone(state_path: Path, file: Path) -> _FileSettings:
    """No node.yaml: no labels, unless a pass read some in it before (then it went
    missing: those are kept, with a warning, as an unreadable one stops nothing)."""
    kept = nodelabels.last_seen(state_path, file)
    if not kept:  # none read there, or none to lose
        return _FileSettings()
    return _FileSettings(labels=kept, warnings=(nodelabels.missing(state_path, file, kept),))


@dataclass(frozen=True, kw_only=True, slots=True)
class GitFlags:
    """The git flags as given (None: not given, node.yaml's key or the default stands)."""

    url: str | None = None
    branch: str | None = None
    tag: str | None = None
    path: str | None = None
    interval: float | None = None
    timeout: float | None = None  # --git-timeout: one fetch's limit


def remembered(state_dir: Path, flags: GitFlags, *, strict: bool = True) -> GitFlags:
    """The git source the state dir followed last (``<state>/git/source.json``), the
    flags given over it; the flags as they are when it follows none (then the git
    source's module, subprocess and all, is not loaded: `status` stays light). A file
    that does not decode is a RecordError when ``strict`` (a pass must not run as if the
    node followed nothing), else named and read as none (a read verb)."""
    if not StateDir(state_dir).git_source.exists():
        return flags
    from controller.store.sources.git.source import peek_status, read_status

    try:
        st = read_status(state_dir) if strict else peek_status(state_dir)
    except ConfigError:
        return flags  # `reconcile source` says what is wrong with it
    if st is None:
        return flags
    return GitFlags(
        url=st.url,
        branch=flags.branch or (None if flags.tag else st.branch),
        tag=flags.tag or (None if flags.branch else st.tag),
        path=flags.path if flags.path is not None else st.path,
        interval=flags.interval or st.interval,
        timeout=flags.timeout or st.timeout,
    )


def set_name(paths: tuple[Path, ...]) -> str:
    """The owner ``-f`` derives: its paths, less a file one of its folders reads anyway.

    `-f m -f m/web.yaml` is the set `-f m` makes (one file is read once), so its records
    are the same set's: another name made every deployment a conflict with itself."""
    return ",".join(str(p) for p in paths if not _read_by_its_folder(p, paths))


def _read_by_its_folder(path: Path, paths: tuple[Path, ...]) -> bool:
    """``manifests.manifest_files``' rule: a visible ``*.yaml``/``*.yml`` in a named folder."""
    name = path.name
    named = path.parent in paths and name.endswith(SUFFIXES) and not name.startswith(".")
    return named and not path.is_dir()


def _owners(state_dir: Path) -> list[str]:
    """The owners the state dir's records carry (read and never set aside, as a read
    verb reads them): a git source followed again may be known only by them."""
    from controller.store.instances.records import RecordStore

    return [rec.owner for rec in RecordStore(state_dir).peek().records.values()]


def _deadline(file: GitFile | None) -> float | None:
    from controller.core.manifest.quantity import parse_duration

    if file is None or file.auto_rollback is None:
        return None
    return parse_duration(str(file.auto_rollback.progress_deadline))


def git_source(flags: GitFlags, file: GitFile | None) -> GitSettings | None:
    """Flags over node.yaml's ``git:``, key by key; None when neither names a URL."""
    url = flags.url or (file.url if file else None)
    if not url:
        if flags.branch or flags.tag or flags.path or flags.interval or flags.timeout:
            raise ConfigError(
                "--branch, --tag, --git-path, --interval and --git-timeout need --git URL"
            )
        return None
    from controller.core.manifest.quantity import parse_duration
    from controller.store.sources.git.source import local_repo, settings

    if flags.url:  # a path is the caller's, as `git clone`'s (a remembered URL is absolute)
        url = local_repo(flags.url, Path.cwd())
    interval = flags.interval
    if interval is None and file is not None and file.interval is not None:
        interval = parse_duration(str(file.interval))
    timeout = flags.timeout
    if timeout is None and file is not None and file.timeout is not None:
        timeout = parse_duration(str(file.timeout))
    # A flag's branch replaces the file's tag and the other way round: the flag is the latest word.
    branch, tag = flags.branch, flags.tag
    if branch is None and tag is None and file is not None:
        branch, tag = file.branch, file.tag
    return settings(
        url=url,
        branch=branch,
        tag=tag,
        path=flags.path if flags.path is not None else (file.path if file else None),
        interval=interval,
        timeout=timeout,
        webhook_secret_file=file.webhook_secret_file if file else None,
        allowed_signers=file.verify.allowed_signers if file and file.verify else None,
        progress_deadline=_deadline(file),
    )


def resolve_backend(backend: str | None, ray_address: str | None) -> tuple[str, str | None]:
    """The backend and its cluster address: flag > RECONCILE_* > (address only) RAY_ADDRESS."""
    env = os.environ
    chosen = backend or env.get("RECONCILE_BACKEND") or backendnames.LOCAL
    if chosen not in BACKENDS:
        raise ConfigError(f"--backend {chosen!r}: expected one of {', '.join(BACKENDS)}")
    if not backendnames.on_cluster(chosen):  # only a cluster has an address
        return chosen, None
    address = ray_address or env.get("RECONCILE_RAY_ADDRESS") or env.get("RAY_ADDRESS")
    if not address:
        raise ConfigError(
            "--ray-address is required with --backend ray (or set RECONCILE_RAY_ADDRESS or"
            " RAY_ADDRESS): the head's GCS address, e.g. 10.0.0.1:6379"
        )
    return chosen, address


def _split(value: str | None) -> list[str]:
    return [p for p in (value or "").split(os.pathsep) if p]


def drain_path(state_dir: Path) -> Path:
    return StateDir(state_dir).drain


def read_drain(state_dir: Path) -> Drain | None:
    try:
        data = json.loads(drain_path(state_dir).read_text())
        if not isinstance(data, dict) or "until" not in data:  # said as such, not as
            raise ValueError("not a drain: no until")  # `list indices…` or `('until')`
        return Drain(
            until=datetime.fromisoformat(data["until"]),
            reason=str(data.get("reason", "")),
            by=str(data.get("by", "")),
            evict=bool(data.get("evict", False)),
            ttl=_ttl(data.get("ttl")),
            boot=bootstamp.read(data),
        )
    except FileNotFoundError:
        return None
    except OSError as exc:  # a folder in its place: named as a torn file is, not a traceback
        raise ConfigError(
            f"{drain_path(state_dir)} is unreadable ({exc.strerror or exc}): remove it (a"
            " drain is asked again with `reconcile drain`)"
        ) from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{drain_path(state_dir)} is unreadable ({exc}): run `reconcile uncordon` to clear it"
        ) from exc


def _ttl(value: object) -> float | None:
    """The ttl asked (None: a file from before it was kept, or not a positive number)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return float(value)


def write_drain(state_dir: Path, drain: Drain) -> None:
    data = {
        "until": drain.until.isoformat(),
        "reason": drain.reason,
        "by": drain.by,
        "evict": drain.evict,
        **({} if drain.ttl is None else {"ttl": drain.ttl}),
        **bootstamp.fields(drain.boot),
    }
    write_atomic(drain_path(state_dir), json.dumps(data).encode())


def clear_drain(state_dir: Path) -> bool:
    try:
        drain_path(state_dir).unlink()
    except FileNotFoundError:
        return False
    return True
