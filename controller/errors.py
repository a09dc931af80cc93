"""The error tree.

ReconcileError
├── ConfigError(ValueError)        bad flag or environment value
├── RecordError(ValueError)        a record cannot be used as is
├── RecipeError(ValueError)        the spec lacks what its engine needs (a model...)
├── InsecureManifest(OSError)      a manifest root must not trust (as root)
├── LockTimeout(TimeoutError)      another pass holds a lock (the holder is named)
├── BackendUnavailable(ConnectionError)  the cluster backend cannot be reached (retry may help)
├── NotProvenOurs                  a live engine this user cannot prove ours: not signalled
└── SpawnError(OSError)            the engine could not be exec'd
    ├── ExecFailed                 its program's exec failed (not found, not executable)
    ├── ContainerError             its container runtime refused (the runtime's words)
    │   └── ImagePullFailed        its image's pull ended without it (backs off holding nothing)
    └── Unplaceable                the cluster has no room for it now (the record goes Pending)
        └── PullingFirst           its model files are pulled to a node with room (Pulling)

An invalid manifest, a placement that cannot be made and a failing probe are not
errors but values (``manifests.ManifestError``, ``placement.Unplaced``,
``state.ProbeResult``): a pass reports them and goes on.
"""

from __future__ import annotations


class ReconcileError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(ReconcileError, ValueError):
    """A flag, environment variable or node setting is wrong."""


class RecordError(ReconcileError, ValueError):
    """A record is unreadable or from an unknown schema version."""


class LockTimeout(ReconcileError, TimeoutError):
    """A lock was not acquired in time; the holder is named in the message."""


class SpawnError(ReconcileError, OSError):
    """The engine could not be exec'd (missing program, permissions)."""


class ExecFailed(SpawnError):
    """The exec of the engine's program failed (no such file, not executable): a start
    that failed before any engine ran, which ``--once`` and ``plan`` exit 1 on until a
    start gets through. ``code`` is the exit of the process that tried (127, as a shell's)."""

    def __init__(self, words: str, code: int | None = None) -> None:
        super().__init__(words)
        self.code = code


class ContainerError(SpawnError):
    """The container runtime refused (no such image, denied, daemon down): its own words."""


class ImagePullFailed(ContainerError):
    """The pull of the engine's image ended without it (no such image, denied, the
    registry down): nothing ran, so the start backs off holding no device and no port,
    as a failed model pull does, and its retry is placed afresh."""


class ContainerExited(ContainerError):
    """The container was made and its engine ran, but exited before its main process was
    seen (its start removes it at once): an engine's exit, with its code, for the
    restart policy to judge; not the runtime's refusal."""

    def __init__(self, code: int, words: str) -> None:
        super().__init__(
            f"engine exited with code {code} at its start" + (f": {words}" if words else "")
        )
        self.code = code


class Unplaceable(SpawnError):
    """The cluster cannot place the engine now; the message names what is missing."""


class PullingFirst(Unplaceable):
    """The nodes that hold the model files have no room: they are pulled to one that has,
    and the start waits for it holding nothing (the record is Pulling, not Pending)."""


class BackendUnavailable(ReconcileError, ConnectionError):
    """The backend's cluster cannot be reached; nothing was changed, a retry may help."""


class NotProvenOurs(ReconcileError):
    """A teardown found the record's engine alive (its pid and start time match) but may
    not read its environment, where the marker that proves it ours is (a file-capability
    or setuid engine is not dumpable: only root, outside any user namespace, reads it).
    Nothing was signalled (only a process proven ours is) and the record is kept (no
    engine survives without one: invariant 3); the message names the pid, why, and the
    next move."""


class RecipeError(ReconcileError, ValueError):
    """The spec lacks what this engine needs (a model, a command...)."""


class InsecureManifest(ReconcileError, OSError):
    """A manifest file or folder root must not trust; the message says why and what to do."""


class StateDirReplaced(ReconcileError):
    """Engines marked with the state dir's path run with another state dir's id (its disk
    not mounted, the folder emptied or replaced): the pass refused to act and changed
    nothing; the message names the engines and the next moves."""
