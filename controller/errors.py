"""The error tree. Each error says whether retrying the same thing can help.

ReconcileError
├── ConfigError(ValueError)        bad flag or environment value      retry: no
├── RecordError(ValueError)        a record cannot be used as is      retry: no
├── LockTimeout(TimeoutError)      another pass holds a lock          retry: yes
└── SpawnError(OSError)            the engine could not be exec'd     retry: yes

An invalid manifest, a placement that cannot be made and a failing probe are not
errors but values (``manifests.ManifestError``, ``placement.Unplaced``,
``state.ProbeResult``): a pass reports them and goes on.
"""

from __future__ import annotations


class ReconcileError(Exception):
    """Base of every error this package raises on purpose."""

    retryable = False


class ConfigError(ReconcileError, ValueError):
    """A flag, environment variable or node setting is wrong."""


class RecordError(ReconcileError, ValueError):
    """A record is unreadable or from an unknown schema version."""


class LockTimeout(ReconcileError, TimeoutError):
    """A lock was not acquired in time; the holder is named in the message."""

    retryable = True


class SpawnError(ReconcileError, OSError):
    retryable = True
