"""Records as plain frozen dataclasses: their JSON round-trips and the schema is checked."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controller.core.frozen import frozen
from controller.core.state import ExitInfo, Phase, ProbeConfig, ProcessRef, Record
from controller.core.values import ValueInvalid

NOW = datetime(2026, 12, 1, 11, 0, 0, 123456, tzinfo=UTC)


def full() -> Record:
    return Record(
        name="web",
        owner="o",
        node="n",
        spec={"engine": "command", "args": ["a", 1]},
        ref=ProcessRef(pid=42, start_time=1.5, start_ticks=7, boot_id="b"),
        extra_ports=(8001, 8002),
        devices=("nvidia:0",),
        device_uuids=("GPU-1", None),
        phase=Phase.BACKOFF,
        probe=ProbeConfig(http=(("/health", None), ("/v1/models", "ok")), period_seconds=0.5),
        started_at=NOW,
        last_exit=ExitInfo(code=3, at=NOW, reason="boom"),
        labels={"team": "search"},
    )


def test_round_trip_through_json() -> None:
    rec = full()
    again = Record.model_validate_json(rec.model_dump_json(indent=1))
    assert again == rec and again.probe.http[1] == ("/v1/models", "ok")
    assert isinstance(again.extra_ports, tuple) and again.phase is Phase.BACKOFF
    assert rec.model_copy(update={"restarts": 2}).restarts == 2 and rec.restarts == 0


def test_reads_what_the_pydantic_records_wrote() -> None:
    """Records on disk from before: datetimes with a Z, every field spelled out."""
    old = json.loads(full().model_dump_json())
    old["started_at"] = "2026-12-01T11:00:00.123456Z"
    assert Record.model_validate(old).started_at == NOW


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"restarts": "2"}, "restarts: Input should be a valid integer"),
        ({"restarts": True}, "restarts: Input should be a valid integer"),
        ({"phase": "Running"}, "phase: Input should be 'Pending'"),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
        ({"ref": {"pid": 42}}, "ref.start_time: Field required"),
        ({"ref": {"pid": 0, "start_time": 1.0}}, "pid: must be in 1.."),
        ({"devices": "nvidia:0"}, "devices: Input should be a valid list"),
        ({"started_at": "yesterday"}, "started_at: Input should be an ISO 8601 time"),
        ({"probe": {"http": [["/health"]]}}, "probe.http.0: Input should have 2 items"),
        ({"labels": {"team": 1}}, "labels.team: Input should be a valid string"),
    ],
)
def test_the_schema_is_checked(change: dict[str, Any], where: str) -> None:
    doc = {**json.loads(full().model_dump_json()), **change}
    with pytest.raises(ValueInvalid) as caught:
        Record.model_validate(doc)
    assert where in str(caught.value)


def test_status_imports_no_pydantic() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from controller.cli.main import main; "
        "main(['status', '--state-dir', sys.argv[1]]); "
        "bad = [m for m in ('pydantic', 'yaml', 'structlog', 'psutil') if m in sys.modules]; "
        "sys.exit(f'imported: {bad}' if bad else 0)"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as state:
        out = subprocess.run([sys.executable, "-c", code, state], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("argv", [["--once", "-q"], ["--once", "--wait", "-q"]])
def test_quiet_passes_import_no_structlog(argv: list[str]) -> None:
    import subprocess
    import sys
    import tempfile

    code = (
        "import sys; from controller.cli.main import main; "
        "rc = main(sys.argv[1:]); "
        "sys.exit(('structlog imported' if 'structlog' in sys.modules else rc))"
    )
    with tempfile.TemporaryDirectory() as root:
        common = ["--allow-empty", "-f", f"{root}/m", "--state-dir", f"{root}/s", "--node", "q"]
        out = subprocess.run(
            [sys.executable, "-c", code, *argv, *common], capture_output=True, text=True
        )
    assert out.returncode == 0, out.stderr


def test_a_pass_over_manifests_imports_no_pydantic(tmp_path: Path) -> None:
    """Manifests and node.yaml check themselves: no pass, no verb pays for pydantic."""
    import subprocess
    import sys

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "web.yaml").write_text(
        "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: web}\n"
        "spec: {engine: command, command: [sleep, '60'], activation: OnDemand}\n"
    )
    (tmp_path / "node.yaml").write_text("maxInstances: 4\n")
    code = (
        "import sys; from controller.cli.main import main; "
        "rc = main(sys.argv[1:]); main(['schema']); "
        "sys.exit('pydantic imported' if 'pydantic' in sys.modules else rc)"
    )
    common = ["-f", f"{tmp_path}/m", "--state-dir", str(tmp_path / "s"), "--node", "q"]
    argv = ["--once", "-q", "--node-config", str(tmp_path / "node.yaml"), *common]
    out = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr


@frozen(kw_only=True, slots=True)
class Ours:
    a: int
    b: tuple[str, ...] = ()
    hidden: int = dataclasses.field(default=0, compare=False, repr=False)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Theirs:
    a: int
    b: tuple[str, ...] = ()
    hidden: int = dataclasses.field(default=0, compare=False, repr=False)


def test_frozen_behaves_as_a_frozen_dataclass() -> None:
    """@frozen shares its methods across classes; what users of a class see is the same."""
    one, same, other = Ours(a=1, b=("x",)), Ours(a=1, b=("x",), hidden=9), Ours(a=2)
    assert one == same and hash(one) == hash(same) and one != other
    assert hash(one) == hash(Theirs(a=1, b=("x",)))
    assert repr(one).replace("Ours", "Theirs") == repr(Theirs(a=1, b=("x",)))
    assert one != Theirs(a=1, b=("x",))  # another class is never equal, as dataclasses say  # type: ignore[comparison-overlap]
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.a = 3  # type: ignore[misc]
    assert dataclasses.replace(one, a=5).a == 5
    assert pickle.loads(pickle.dumps(one)) == one and copy.deepcopy(one) == one
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'a'"):
        Ours()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        Ours(a=1, c=2)  # type: ignore[call-arg]
    match one:
        case Ours(a=1, b=("x",)):
            pass
        case _:
            raise AssertionError("match on fields")


def test_frozen_positional_fields_factories_and_post_init() -> None:
    seen: list[int] = []

    @frozen
    class Point:
        x: int
        y: int = 0
        tags: list[str] = dataclasses.field(default_factory=list)

        def __post_init__(self) -> None:
            seen.append(self.x)

    p = Point(1, 2)
    assert (p.x, p.y, p.tags) == (1, 2, []) and seen == [1]
    assert Point(3).tags is not Point(3).tags  # a fresh list each time
    assert dataclasses.fields(Point)[0].name == "x" and Point.__match_args__ == ("x", "y", "tags")
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        Point(1, x=2)  # type: ignore[misc]
    with pytest.raises(TypeError, match="takes from 2 to 4 positional arguments but 5 were given"):
        Point(1, 2, [], 4)  # type: ignore[call-arg]
    assert (
        repr(Point(1))
        == "test_frozen_positional_fields_factories_and_post_init.<locals>.Point(x=1, y=0, tags=[])"
    )
