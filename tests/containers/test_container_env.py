"""spec.env values no engine can be given, in a container and as a process alike.

A NUL byte in an env value (YAML's ``"\\0"``): a process's start died of Python's
``ValueError: embedded null byte`` (a traceback from `--once`); a container's of runc's
refusal, exit 126, which reconcile then said was its program missing from the image.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from containers.conftest import Engine, write

if TYPE_CHECKING:
    from conftest import Reconcile, Result


def _refused(done: Result, manifest_text: str, manifest: str) -> str:
    lines = manifest_text.splitlines()
    line = 1 + next(i for i, text in enumerate(lines) if "NUL:" in text)
    said = f"{manifest}:{line}: spec.env.NUL: holds a NUL byte (\\0), which no argument or "
    assert said in done.err and "Traceback" not in done.err, done
    return said


def test_a_nul_in_an_env_value_is_refused_at_its_line_for_a_container(
    rc: Reconcile, engine: Engine
) -> None:
    manifest = write(rc, engine, "nul", env={"NUL": "a\0b"})
    said = _refused(rc.once(check=1), manifest.read_text(), str(manifest))
    record = rc.record("nul")
    assert record is not None and record["phase"] == "Pending", record
    assert said in record["message"] and "not executable" not in record["message"], record
    assert engine.ours(rc.state) == []
    rc.down()


def test_a_nul_in_an_env_value_is_refused_at_its_line_for_a_process(
    reconcile: Reconcile,
) -> None:
    manifest = reconcile.write("nul", env={"NUL": "a\0b"})
    said = _refused(reconcile.once(check=1), manifest.read_text(), str(manifest))
    record = reconcile.record("nul")
    assert record is not None and record["phase"] == "Pending" and said in record["message"]
    reconcile.down()
