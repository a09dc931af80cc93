"""A record's JSON: written with ``asdict``, read back field by field, one reader per version.

A record file may be truncated, hand-edited or written by another reconcile, so every
field is read with its type checked, unknown fields are refused, and the first problem
is reported with its path (``ref.pid: ...``): the store quarantines the file with it.
Defaults are the dataclasses' own (``_BLANK``), so a field added later reads from an
older file as the code's default. A fact that an older version kept only inside the spec
document is derived from it by that version's reader (``record_v1``), never left at a
default that would disagree with the engine already running.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal, TypeVar

from controller.core.elapsed import BootClock
from controller.core.engines import RecipeError, default_affinity, readiness_deadline
from controller.core.manifest.names import model_names
from controller.core.state import (
    NEWEST_VERSION,
    VERSION,
    ContainerRef,
    ExitInfo,
    Phase,
    ProbeConfig,
    ProcessRef,
    Record,
    UnreadExit,
)

T = TypeVar("T")
_BLANK = Record(name="", owner="", node="")
_PROBE = ProbeConfig()
_REQUIRED: Any = object()  # the default of a field a record must have


class RecordInvalid(ValueError):
    """A record document that does not fit the record: where (a dotted path) and what."""


def to_json(record: Record) -> bytes:
    data = dataclasses.asdict(record)
    # Version 4 only where it says more than 3 (NEWEST_VERSION): the rest stay files the
    # releases before it read (an unknown field would have them quarantine the record).
    if data["unread_exit"] is None:
        del data["unread_exit"]
    else:
        data["version"] = NEWEST_VERSION
    return json.dumps(data, indent=1, default=_iso).encode() + b"\n"


def _iso(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


class NotJSON(RecordInvalid):
    """A record file that is not JSON at all (torn, or not a record file)."""


class UnknownVersion(RecordInvalid):
    """A record of a version this reconcile has no reader for (``data``: what it holds,
    for the devices and ports it may still lease)."""

    def __init__(self, data: Any, version: object) -> None:
        super().__init__(f"version: {version!r} is not one of {sorted(READERS)}")
        self.data = data


def from_json(raw: bytes | str) -> Record:
    """A record from its file's bytes: the one decoder (the store, the gateway's watch).
    NotJSON, UnknownVersion or RecordInvalid (all ValueErrors) if it is none."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise NotJSON(f"not valid JSON: {exc}") from exc
    # Not an object at all: no version to respect, so a corrupt record of ours.
    version = data.get("version") if isinstance(data, dict) else VERSION
    reader = READERS.get(version) if isinstance(version, int) else None
    if reader is None:
        raise UnknownVersion(data, version)
    return reader(data)


class Fields:
    """One JSON object, its fields taken one at a time, each checked for its type."""

    def __init__(self, data: object, where: str = "") -> None:
        if not isinstance(data, dict):
            raise RecordInvalid(f"{where or '(top)'}: should be an object, not {_kind(data)}")
        self.data: dict[str, Any] = data
        self.where = where
        self.seen: set[str] = set()

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def raw(self, key: str, default: Any) -> Any:
        self.seen.add(key)
        if key in self.data:
            return self.data[key]
        if default is _REQUIRED:
            raise RecordInvalid(f"{self.path(key)}: field required")
        return default

    def take(self, key: str, kind: type[T], default: T = _REQUIRED) -> T:
        return _typed(self.raw(key, default), kind, self.path(key))

    def maybe(self, key: str, kind: type[T]) -> T | None:
        value = self.raw(key, None)
        return None if value is None else _typed(value, kind, self.path(key))

    def items(self, key: str, kind: type[T], default: tuple[T, ...] = ()) -> tuple[T, ...]:
        value = self.raw(key, default)
        if not isinstance(value, list | tuple):
            raise RecordInvalid(f"{self.path(key)}: should be a list, not {_kind(value)}")
        return tuple(_typed(v, kind, f"{self.path(key)}.{i}") for i, v in enumerate(value))

    def time(self, key: str) -> datetime | None:
        value = self.maybe(key, str)
        try:
            return None if value is None else datetime.fromisoformat(value)
        except ValueError:
            raise RecordInvalid(f"{self.path(key)}: not an ISO 8601 time: {value!r}") from None

    def nested(self, key: str, read: Callable[[Fields], T]) -> T | None:
        value = self.raw(key, None)
        return None if value is None else read(Fields(value, self.path(key)))

    def build(self, make: Callable[[], T]) -> T:
        """``make()`` reads the fields and builds the value; then no key may be left unread."""
        try:
            made = make()
        except RecordInvalid:
            raise
        except ValueError as exc:  # the value's own check (a pid's range), named where it sits
            raise RecordInvalid(f"{self.where or '(top)'}: {exc}") from None
        extra = sorted(set(self.data) - self.seen)
        if extra:
            raise RecordInvalid(f"{self.path(extra[0])}: unknown field")
        return made


def _typed(value: object, kind: type[T], where: str) -> T:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)  # JSON writes 2.0 as 2.0, but a hand-edited 2 is a float too
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RecordInvalid(f"{where}: should be {kind.__name__}, not {_kind(value)}")
    return value


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _strings(fields: Fields, key: str) -> dict[str, str]:
    value = fields.take(key, dict, {})
    for k, v in value.items():
        _typed(v, str, f"{fields.path(key)}.{k}")
    return dict(value)


def _process_ref(f: Fields) -> ProcessRef:
    return f.build(
        lambda: ProcessRef(
            pid=f.take("pid", int),
            start_time=f.take("start_time", float),
            start_ticks=f.maybe("start_ticks", int),
            boot_id=f.maybe("boot_id", str),
        )
    )


def _container(f: Fields) -> ContainerRef:
    return f.build(
        lambda: ContainerRef(
            runtime=f.take("runtime", str),
            id=f.take("id", str),
            image=f.take("image", str),
            digest=f.take("digest", str, ""),
        )
    )


def _exit_info(f: Fields) -> ExitInfo:
    return f.build(
        lambda: ExitInfo(
            code=f.maybe("code", int),
            signal=f.maybe("signal", int),
            at=_required(f.time("at"), f.path("at")),
            reason=f.take("reason", str, ""),
        )
    )


def _unread_exit(f: Fields) -> UnreadExit:
    return f.build(
        lambda: UnreadExit(
            nonce=f.take("nonce", str),
            container=_required(f.nested("container", _container), f.path("container")),
            exit=_required(f.nested("exit", _exit_info), f.path("exit")),
        )
    )


def _required(value: T | None, where: str) -> T:
    if value is None:
        raise RecordInvalid(f"{where}: field required")
    return value


def _probe(f: Fields) -> ProbeConfig:
    # An earlier release kept the engine's API key here: read past, never kept (DESIGN.md
    # "Secrets"); the prober finds the key when it probes (core/engines/apikey.py).
    f.raw("bearer", None)
    return f.build(
        lambda: ProbeConfig(
            http=_checks(f),
            tcp=f.take("tcp", bool, _PROBE.tcp),
            period_seconds=f.take("period_seconds", float, _PROBE.period_seconds),
            completion=f.maybe("completion", str),
            model=f.take("model", str, _PROBE.model),
            timeout_seconds=f.take("timeout_seconds", float, _PROBE.timeout_seconds),
            failure_threshold=f.take("failure_threshold", int, _PROBE.failure_threshold),
        )
    )


def _checks(f: Fields) -> tuple[tuple[str, str | None], ...]:
    """``[[path, contains-or-null], ...]``."""
    out: list[tuple[str, str | None]] = []
    for i, check in enumerate(f.items("http", list)):
        where = f"{f.path('http')}.{i}"
        if len(check) != 2:
            raise RecordInvalid(f"{where}: should be [path, contains], not {len(check)} items")
        contains = None if check[1] is None else _typed(check[1], str, f"{where}.1")
        out.append((_typed(check[0], str, f"{where}.0"), contains))
    return tuple(out)


def _phase(f: Fields) -> Phase:
    value = f.take("phase", str, _BLANK.phase)
    try:
        return Phase(value)
    except ValueError:
        choices = ", ".join(p.value for p in Phase)
        raise RecordInvalid(f"{f.path('phase')}: {value!r} is not one of {choices}") from None


def _device_uuids(f: Fields) -> tuple[str | None, ...]:
    uuids = f.items("device_uuids", object)
    for i, uuid in enumerate(uuids):
        if uuid is not None:
            _typed(uuid, str, f"{f.path('device_uuids')}.{i}")
    return tuple(u if isinstance(u, str) else None for u in uuids)


def record_v4(data: object) -> Record:
    """Version 4: every field of :class:`Record` as ``to_json`` writes it."""
    f, b = Fields(data), _BLANK
    return f.build(
        lambda: Record(
            version=_version(f),
            name=f.take("name", str),
            owner=f.take("owner", str),
            source=f.take("source", str, b.source),
            spec_hash=f.take("spec_hash", str, b.spec_hash),
            stored_spec=dict(f.take("stored_spec", dict, {})),
            spec_valid=f.take("spec_valid", bool, b.spec_valid),
            activation=_activation(f.take("activation", str, b.activation), "activation"),
            idle_timeout=f.maybe("idle_timeout", float),
            ready_deadline_seconds=f.maybe("ready_deadline_seconds", float),
            models=f.items("models", str),
            device_count=f.take("device_count", int, b.device_count),
            affinity=_affinity(f.take("affinity", str, b.affinity), "affinity"),
            scale_to_zero=f.take("scale_to_zero", bool, b.scale_to_zero),
            fallbacks=f.items("fallbacks", str),
            fallback_after=f.take("fallback_after", float, b.fallback_after),
            node=f.take("node", str),
            backend=f.take("backend", str, b.backend),
            engine=f.take("engine", str, b.engine),
            nonce=f.maybe("nonce", str),
            ref=f.nested("ref", _process_ref),
            container=f.nested("container", _container),
            reserved_by=f.nested("reserved_by", _process_ref),
            host=f.take("host", str, b.host),
            port=f.maybe("port", int),
            extra_ports=f.items("extra_ports", int),
            devices=f.items("devices", str),
            shareable=f.take("shareable", bool, b.shareable),
            device_uuids=_device_uuids(f),
            memory=f.maybe("memory", int),
            priority=f.take("priority", int, b.priority),
            phase=_phase(f),
            probe=f.nested("probe", _probe) or _PROBE,
            liveness=f.nested("liveness", _probe),
            liveness_failures=f.take("liveness_failures", int, b.liveness_failures),
            stop_signal=f.take("stop_signal", int, b.stop_signal),
            grace_seconds=f.take("grace_seconds", float, b.grace_seconds),
            restart_policy=f.take("restart_policy", str, b.restart_policy),
            reserved_at=f.time("reserved_at"),
            started_at=f.time("started_at"),
            ready_deadline_at=f.time("ready_deadline_at"),
            ready_at=f.time("ready_at"),
            ready_boot=f.nested("ready_boot", _boot_clock),
            restarts=f.take("restarts", int, b.restarts),
            backoff_until=f.time("backoff_until"),
            last_exit=f.nested("last_exit", _exit_info),
            unread_exit=f.nested("unread_exit", _unread_exit),
            revision=f.maybe("revision", str),
            message=f.take("message", str, b.message),
            idle_since=f.time("idle_since"),
            idle_boot=f.nested("idle_boot", _boot_clock),
            labels=_strings(f, "labels"),
        )
    )


def _boot_clock(f: Fields) -> BootClock:
    return f.build(
        lambda: BootClock(boot_id=f.take("boot_id", str), seconds=f.take("seconds", float))
    )


# Fields version 4 added: a version-3 file holding one was not written by version 3.
_ADDED_IN_V4 = ("unread_exit",)


def record_v3(data: object) -> Record:
    """Version 3: version 4 without an unread exit (``to_json`` writes a record holding
    one as version 4, every other as version 3)."""
    _refuse(Fields(data), _ADDED_IN_V4)
    return record_v4(data)


# Fields version 3 added: a version-2 file holding one was not written by version 2.
_ADDED_IN_V3 = ("ready_boot", "idle_boot")


def record_v2(data: object) -> Record:
    """Version 2: version 3 without the boot clock beside ``ready_at`` and ``idle_since``
    (the wall clock judges them, as version 2 did)."""
    _refuse(Fields(data), _ADDED_IN_V3)
    return record_v3(data)


def _refuse(f: Fields, added: tuple[str, ...]) -> None:
    for key in added:
        if key in f.data:
            raise RecordInvalid(f"{key}: unknown field")


def _version(f: Fields) -> int:
    """Whichever version's reader read it, the record in memory is a current one (and is
    written back as such)."""
    f.take("version", int)
    return VERSION


def _activation(value: str, where: str) -> Literal["Always", "OnDemand"]:
    if value == "Always":
        return "Always"
    if value == "OnDemand":
        return "OnDemand"
    raise RecordInvalid(f"{where}: {value!r} is not one of Always, OnDemand")


def _affinity(value: str, where: str) -> Literal["none", "session", "prefix"]:
    for known in AFFINITIES:
        if value == known:
            return known
    raise RecordInvalid(f"{where}: {value!r} is not one of {', '.join(AFFINITIES)}")


AFFINITIES: tuple[Literal["none", "session", "prefix"], ...] = ("none", "session", "prefix")


# Fields version 2 added: a version-1 file holding one was not written by version 1.
_ADDED_IN_V2 = (
    "stored_spec",
    "activation",
    "idle_timeout",
    "ready_deadline_seconds",
    "models",
    "device_count",
)


def record_v1(data: object) -> Record:
    """Version 1: the spec's facts lived in the ``spec`` document alone.

    Derived here, once, as ``RecordMaker.described`` renders them for a new record
    (``readiness_deadline`` is the very function render uses), then read as version 2.
    """
    f = Fields(data)
    _refuse(f, _ADDED_IN_V2 + _ADDED_IN_V3)
    upgraded = {k: v for k, v in f.data.items() if k != "spec"}
    spec = f.take("spec", dict, {})
    name = f.data.get("name")
    upgraded.update(stored_spec=spec, **_facts(spec, name if isinstance(name, str) else ""))
    return record_v2(upgraded)


def _facts(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """The typed facts of a version-1 spec document (camelCase, as the manifest)."""
    doc = Fields(spec, "spec")
    activation = _activation(doc.take("activation", str, "Always"), "spec.activation")
    idle = doc.maybe("idleTimeout", float)
    model = doc.maybe("model", str)
    devices = doc.nested("devices", lambda d: d.data.get("count", 0))
    readiness = doc.nested("readiness", lambda r: r.maybe("deadlineSeconds", float))
    engine = doc.maybe("engine", str)
    deadline = None
    if engine is not None:  # a rejected manifest's record has no spec: nothing to wait for
        try:
            deadline = readiness_deadline(engine, readiness)
        except RecipeError as exc:
            raise RecordInvalid(f"spec.engine: {exc}") from None
    return {
        "activation": activation,
        "idle_timeout": idle,
        "ready_deadline_seconds": deadline,
        "models": list(model_names(name, model, doc.items("aliases", str))),
        "device_count": _typed(devices or 0, int, "spec.devices.count"),
        "affinity": _affinity(
            doc.take("affinity", str, default_affinity(engine or "")), "spec.affinity"
        ),
    }


# The record versions this reconcile reads; a file of another is left in place (records.py).
READERS: dict[int, Callable[[object], Record]] = {
    1: record_v1,
    2: record_v2,
    VERSION: record_v3,
    NEWEST_VERSION: record_v4,
}
