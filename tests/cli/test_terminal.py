"""Terminal and journald manners: NO_COLOR, TERM=dumb, --no-color, <N> priorities, and
other libraries' lines and dying threads inside the JSON-lines stream."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog

from controller import logsetup
from controller.cli.render import waiting
from controller.core.state import Phase, Record
from controller.reconciler.run import PassResult

REPO = Path(__file__).resolve().parents[2]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("NO_COLOR", "TERM", "JOURNAL_STREAM"):
        monkeypatch.delenv(name, raising=False)
    yield
    structlog.reset_defaults()


@pytest.mark.parametrize(
    ("env", "flag", "colour", "fancy"),
    [
        ({}, True, True, True),
        ({"NO_COLOR": "1"}, True, False, True),
        ({"NO_COLOR": "0"}, True, False, True),  # any non-empty value
        ({"NO_COLOR": ""}, True, True, True),  # empty: as if unset (no-color.org)
        ({"TERM": "dumb"}, True, False, False),
        ({}, False, False, True),  # --no-color
    ],
)
def test_what_a_terminal_can_show(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], flag: bool, colour: bool, fancy: bool
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert logsetup.terminal(Tty(), colour=flag) == logsetup.Terminal(colour, fancy)
    assert logsetup.terminal(io.StringIO()) == logsetup.Terminal(False, False)  # a pipe


@pytest.mark.parametrize("env", [{}, {"NO_COLOR": "1"}, {"TERM": "dumb"}])
def test_the_console_log_has_colours_only_where_allowed(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    logsetup.configure(0, json=False)
    logsetup.apply()
    logsetup.get_logger("t").warning("hello", deployment="web")
    assert "hello" in err.getvalue()
    assert ("\x1b[" in err.getvalue()) is (not env)


def test_the_console_log_escapes_what_an_engine_wrote(monkeypatch: pytest.MonkeyPatch) -> None:
    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    logsetup.configure(0, json=False, colour=False)
    logsetup.apply()
    logsetup.get_logger("t").warning("engine said \x1b[2J", line="a\x00b\u202eevil\nforged")
    shown = err.getvalue()
    assert "\x1b" not in shown and "\x00" not in shown and "\u202e" not in shown
    assert "engine said \\x1b[2J" in shown and "a\\x00b\\u202eevil\\x0aforged" in shown
    assert shown.count("\n") == 1  # one line: no forged second line


def test_the_log_follows_stderr_swapped_after_configure(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream swapped after configure (pytest's capture per test, redirect_stderr) and
    the old one closed: the next line goes to the stream in place, with no "I/O
    operation on closed file" raised inside whoever logged (a gateway's loop)."""
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logsetup.configure(0, json=True)
    logsetup.apply()
    logsetup.get_logger("t").warning("one")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    logsetup.get_logger("t").warning("two")
    assert '"event": "two"' in second.getvalue()


class _Ready:
    config = SimpleNamespace(state_dir=Path("/nonexistent"))  # no pull to look for

    def run_pass(self) -> PassResult:
        rec = Record(name="web", owner="o", node="n", phase=Phase.READY)
        return PassResult(records={"web": rec}, owner="o", names={"web"}, node="n")


@pytest.mark.parametrize(("term", "fancy"), [("xterm", True), ("dumb", False)])
def test_wait_redraws_in_place_only_on_a_capable_terminal(
    monkeypatch: pytest.MonkeyPatch, term: str, fancy: bool
) -> None:
    monkeypatch.setenv("TERM", term)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # Lines logs here
    screen = Tty()
    assert waiting.wait_until_ready(_Ready(), 1.0, stream=screen) is True  # type: ignore[arg-type]
    shown = screen.getvalue()
    assert ("✔" in shown) is fancy and ("\x1b[" in shown) is fancy


SCRIPT = """
import logging, threading
from controller import logsetup
logsetup.configure(0)
log = logsetup.get_logger("reconcile")
log.info("pass done")
log.warning("slow probe")
log.error("spawn failed")
logging.getLogger("watchdog.observers").warning("inotify watch limit reached")
def boom():
    raise RuntimeError("observer died")
t = threading.Thread(target=boom, name="watchdog-observer")
t.start(); t.join()
"""


@pytest.mark.parametrize("journal", [True, False], ids=["journald", "plain-file"])
def test_log_lines_for_journald_and_json(tmp_path: Path, journal: bool) -> None:
    out = tmp_path / "stderr"
    with open(out, "wb") as err:
        info = os.fstat(err.fileno())
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        if journal:
            env["JOURNAL_STREAM"] = f"{info.st_dev}:{info.st_ino}"
        else:
            env["JOURNAL_STREAM"] = "1:2"  # another stream's: not ours, no prefixes
        subprocess.run([sys.executable, "-c", SCRIPT], stderr=err, env=env, check=True)
    lines = out.read_text().splitlines()
    assert len(lines) == 5, lines  # one line each: no traceback lines of their own
    prefixes = [line[: line.index("{")] for line in lines]
    if journal:
        assert prefixes == ["<6>", "<4>", "<3>", "<4>", "<3>"]
    else:
        assert prefixes == [""] * 5
    docs: list[dict[str, Any]] = [json.loads(line[line.index("{") :]) for line in lines]
    assert docs[3]["event"] == "inotify watch limit reached"
    assert docs[3]["logger"] == "watchdog.observers"
    assert docs[4]["event"] == "thread died" and docs[4]["thread"] == "watchdog-observer"
    assert "RuntimeError: observer died" in docs[4]["exception"]


def test_the_unit_points_at_the_docs() -> None:
    unit = (REPO / "examples/systemd/reconcile.service").read_text()
    assert "Documentation=https://pypi.org/project/reconcile-engines/" in unit


def test_no_color_is_a_flag_before_or_after_the_verb(tmp_path: Path) -> None:
    for argv in (["--no-color", "status"], ["status", "--no-color"]):
        cmd = [sys.executable, "-m", "controller", *argv, "--state-dir", str(tmp_path)]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout == "No deployments.\n"


# rich (~12 MB of RSS) stays out of the process: structlog is imported with it blocked.
# FALLBACK goes last on sys.path: stand-ins for rich and better_exceptions where they
# are not installed, so structlog would import them either way were they not blocked.
LOG_A_LINE = """
import sys
sys.path.append(sys.argv[1])
{before}
from controller import logsetup
logsetup.configure(0, json={json})
log = logsetup.get_logger("t")
log.info("hello")
try:
    1 / 0
except ZeroDivisionError:
    log.exception("boom")
assert "structlog" in sys.modules
{after}
"""


def _run(tmp_path: Path, script: str) -> str:
    fallback = tmp_path / "fallback"
    (fallback / "rich").mkdir(parents=True)
    (fallback / "rich/__init__.py").write_text("STAND_IN = True\n")
    (fallback / "better_exceptions.py").write_text("STAND_IN = True\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-c", script, str(fallback)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stderr


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "console"])
def test_logging_does_not_load_rich(tmp_path: Path, as_json: bool) -> None:
    after = """
unwanted = ("rich", "better_exceptions", "asyncio", "ssl")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in unwanted)
assert not loaded, loaded
"""
    err = _run(tmp_path, LOG_A_LINE.format(before="", json=as_json, after=after))
    assert "hello" in err
    # a plain traceback, whole: Python's own lines
    assert "Traceback (most recent call last):" in err
    assert "ZeroDivisionError: division by zero" in err


@pytest.mark.parametrize("when", ["after", "before"])
def test_rich_still_imports_after_logging(tmp_path: Path, when: str) -> None:
    """The block is lifted after structlog's import; a rich loaded before stays loaded."""
    load = "import rich, better_exceptions\nfirst = sys.modules['rich']"
    check = """
import rich, better_exceptions
assert sys.modules["rich"] is rich and sys.modules["better_exceptions"] is better_exceptions
"""
    if when == "before":
        check += "assert rich is first\n"
    before = load if when == "before" else ""
    _run(tmp_path, LOG_A_LINE.format(before=before, json=True, after=check))


@pytest.mark.parametrize("when", ["after", "before"])
def test_asyncio_is_real_for_everyone_and_for_structlog_s_async_methods(
    tmp_path: Path, when: str
) -> None:
    """asyncio is deferred for structlog alone: anyone's import gets the real module, and
    structlog's async methods (which import it through the stand-in) log."""
    check = """
import asyncio, types
assert type(sys.modules["asyncio"]) is types.ModuleType and asyncio.run is not None
async def main():
    await logsetup.structlog_module().get_logger().ainfo("async line")
asyncio.run(main())
"""
    before = "import asyncio" if when == "before" else ""
    err = _run(tmp_path, LOG_A_LINE.format(before=before, json=True, after=check))
    assert "async line" in err


SWALLOWED = """
import os, signal, sys
from pathlib import Path
from types import SimpleNamespace
from controller.cli.render import waiting
from controller.core.state import Phase, Record
from controller.reconciler.run import PassResult


class Interrupted:
    def __del__(self):  # Python runs this itself: an exception raised here is dropped
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs between these bytecodes
            pass


class Starting:
    config = SimpleNamespace(state_dir=Path("/nonexistent"))

    def run_pass(self):
        Interrupted()  # dropped at once: Ctrl-C lands in its __del__
        rec = Record(name="web", owner="o", node="n", phase=Phase.STARTING)
        return PassResult(records={"web": rec}, owner="o", names={"web"}, node="n")


try:
    waiting.wait_until_ready(Starting(), 60.0)
except KeyboardInterrupt:
    sys.exit(130)
sys.exit(0)
"""


def test_ctrl_c_dropped_inside_a_callback_still_ends_the_wait(tmp_path: Path) -> None:
    """CI saw `--wait` go on for good after Ctrl-C: the interrupt landed in importlib's
    module-lock callback during a lazy import, where Python drops it ("Exception ignored
    in"). The wait remembers the Ctrl-C and ends at its next step, with no traceback."""
    out = subprocess.run(
        [sys.executable, "-c", SWALLOWED],
        capture_output=True,
        text=True,
        timeout=30,  # before the fix: the wait's 60 s, then the next pass, for good
        env={**os.environ, "TERM": "dumb"},
        cwd=tmp_path,
    )
    assert out.returncode == 130, out.stderr[-2000:]
    assert waiting.INTERRUPTED in out.stderr, out.stderr[-2000:]
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_an_engine_that_fails_is_a_warning_line(reconcile: Any) -> None:
    """Every action line was `info`, an engine's crash too, so `journalctl -u reconcile
    -p warning` (README: what needs a look) never showed a crash loop."""
    reconcile.write("crashy", command=["sh", "-c", "exit 3"])

    def levels() -> dict[str, str] | None:
        err = reconcile("--once", check=None).err
        docs = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        found = {d["action"]: d["level"] for d in docs if d.get("event") == "action"}
        return found if "fail" in found else None

    found = reconcile.wait_for(levels, timeout=60, what="crashy's fail line")
    assert found["fail"] == "warning", found
    assert found.get("restart", found.get("start")) == "info", found  # routine: info
    reconcile.down()
