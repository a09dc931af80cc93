"""The suite's net and alarm (issue 40): ``scripts/rerun-failed`` runs a failed test once
more, alone, and says so; pyproject's per-test timeout fails a hung test with every
thread's stack and goes on to the next test. Real pytest runs on small generated suites."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The generated suites need no plugin of the environment's (hypothesis, xdist, asyncio...):
# loading them all was ~2/3 of each inner pytest's start, and a test here starts 2 to 4.
BARE = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}

# Fails the first time it runs (its mark file is not there yet), passes the second.
FLAKY = """
from pathlib import Path
MARK = Path(__file__).with_suffix(".ran")

def test_flaky():
    first = not MARK.exists()
    MARK.touch()
    assert not first, "the first run fails"

def test_steady():
    pass
"""

BROKEN = """
def test_broken():
    assert 1 == 2, "always"
"""

HUNG = """
import threading, time
import pytest

def _helper_loop():
    while True:
        time.sleep(0.05)

@pytest.mark.timeout(1)
def test_hangs():
    threading.Thread(target=_helper_loop, name="helper-loop", daemon=True).start()
    time.sleep(600)

def test_after():
    pass
"""


def _run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def _rerun(suite: Path, **env: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(REPO / "scripts/rerun-failed"), "-p", "no:cacheprovider", "."]
    return _run(argv, suite, **BARE, **env)


def test_a_test_that_passes_alone_is_flaky_and_counted(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(FLAKY)
    log = tmp_path / "flaky.log"
    done = _rerun(tmp_path, RECONCILE_FLAKY_LOG=str(log))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    flaky = [line for line in lines if line.startswith("FLAKY: ")]
    assert flaky == [
        "FLAKY: test_suite.py::test_flaky (first run, call: AssertionError: the first run fails)"
    ], done.stdout
    assert lines[-1] == "rerun-failed: 1 flaky (passed alone), 0 failed twice"
    assert log.read_text() == "test_suite.py::test_flaky\n"


def test_a_test_that_fails_twice_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(BROKEN)
    done = _rerun(tmp_path)
    assert done.returncode == 1
    assert "FAILED TWICE: test_suite.py::test_broken" in done.stdout
    assert not [line for line in done.stdout.splitlines() if line.startswith("FLAKY")]
    assert done.stdout.splitlines()[-1] == "rerun-failed: 0 flaky (passed alone), 1 failed twice"


def test_a_run_pytest_could_not_finish_is_not_rerun(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text("import no_such_module_here\n")
    done = _rerun(tmp_path)
    assert done.returncode == 2  # a collection error: pytest's "interrupted"
    assert "nothing rerun (pytest exit 2" in done.stdout


def test_a_hung_test_fails_with_every_threads_stack_and_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "test_hung.py").write_text(HUNG)
    argv = [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml")]
    done = _run([*argv, "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "."], tmp_path)
    assert done.returncode == 1
    assert "Failed: Timeout (>1.0s) from pytest-timeout" in done.stdout, done.stdout
    assert "helper-loop" in done.stdout  # the other thread's stack is printed too
    assert "1 failed, 1 passed" in done.stdout  # test_after still ran


SKIPS = """
import missing

def test_needs_a_tool():
    missing.skip("no-such-tool", "apt-get install no-such-tool")
"""


def test_a_skip_for_a_missing_tool_fails_only_in_ci(tmp_path: Path) -> None:
    (tmp_path / "test_tools.py").write_text(SKIPS)
    (tmp_path / "conftest.py").write_text("from missing import pytest_runtest_makereport\n")
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "."]
    tests = str(REPO / "tests")
    here = _run(argv, tmp_path, PYTHONPATH=tests, CI="", **BARE)
    assert here.returncode == 0 and "1 skipped" in here.stdout, here.stdout
    assert "install: apt-get install no-such-tool" in here.stdout
    ci = _run(argv, tmp_path, PYTHONPATH=tests, CI="true", **BARE)
    assert ci.returncode == 1 and "1 failed" in ci.stdout, ci.stdout
    assert "CI=true: a needed tool is missing" in ci.stdout


def test_the_ray_tests_share_one_worker_sent_first_and_the_cluster_another() -> None:
    """scripts/test's ``--dist loadgroup`` (on two workers here): tests/ray is one unit of
    work (one Ray cluster, built once), tests/cluster another (its namespace cluster, off
    the Ray unit's chain), every other test one of its own
    (tests/conftest.py's scheduler; pytest-xdist's own groups are lost under pytest 9,
    pytest-xdist#1386). The Ray unit, the run's longest chain, is sent first wherever it
    is collected: collected after the map's three tests here, as after tests/cli in a run."""
    from workunits import work_unit

    cluster = work_unit("tests/cluster/test_partition.py::t")
    assert work_unit("tests/ray/a.py::t") == work_unit("tests/ray/b.py::t") != cluster
    assert cluster == work_unit("tests/cluster/test_fleet_hosts.py::t")
    assert work_unit("tests/gateway/test_a.py::t1") != work_unit("tests/gateway/test_a.py::t2")
    # A file whose module fixture starts processes is one unit: the fixture set up once.
    page = work_unit("tests/ui/test_page.py::test_a")
    assert page == work_unit("tests/ui/test_page.py::test_b[x]") != work_unit("tests/ui/x.py::t")
    files = ["tests/test_module_map.py", "tests/ray/test_ray_config.py"]
    # Four of the Ray file's tests, each a refusal (~0.3 s): more than two, so its unit fills
    # its worker's first batch and the other worker takes the map's tests (xdist's loadscope
    # hands each worker a unit, then more to one with two or fewer pending). The others
    # (connect attempts, an import check: ~2.5 s) prove nothing more about placement; the
    # four are named, not the others left out (a test added to the file came in as a fifth).
    fast = "without_an_address or fields_without_cluster_meaning or test_the_map or test_every"
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "-k", fast]
    got = _run([*argv, "--dist", "loadgroup", "-v", *files], REPO)
    assert got.returncode == 0, got.stdout[-3000:]
    workers: dict[str, set[str]] = {}
    first: dict[str, str] = {}  # each worker's first test, in the order it ran them
    for line in got.stdout.splitlines():
        if line.startswith("[gw") and " PASSED " in line:
            worker, nodeid = line.split()[0], line.split(" PASSED ")[1].strip()
            workers.setdefault(nodeid.split("::")[0], set()).add(worker)
            first.setdefault(worker, nodeid.split("::")[0])
    assert set(workers) == set(files), got.stdout[-3000:]
    assert len(workers["tests/ray/test_ray_config.py"]) == 1, workers
    (ray_worker,) = workers["tests/ray/test_ray_config.py"]
    # sent first: in collection order each worker had a map test first, then the Ray unit
    assert first[ray_worker] == "tests/ray/test_ray_config.py", got.stdout[-3000:]
    ray = [ln for ln in got.stdout.splitlines() if " PASSED tests/ray/" in ln]
    assert len(ray) == 4, got.stdout[-3000:]  # the four selected, all on that one worker
    # the other worker is free for the rest meanwhile
    assert workers["tests/test_module_map.py"] - workers["tests/ray/test_ray_config.py"], workers
