"""The benchmark command runs end to end with tiny N (``python -m benchmarks --quick``).

No timings are asserted (the machine is noisy): speed lives in ``benchmarks/``. Budget:
~20 s a test. The benchmarks clean up after themselves (engines by their node's marker,
supervisord by SIGTERM), so the run must leave nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import missing
import pytest

REPO = Path(__file__).resolve().parents[1]
RUN_LIMIT = 420  # s: ~60-110 on this box, idle to busy; a loaded one took 300 and more
STOP_LIMIT = 60  # s for its clean-up after a SIGTERM
# Each test's own limit (pytest-timeout's) leaves room for both: at the suite's 300 s the
# test was failed by an exception inside the run, which SIGKILLed the benchmark alone.
pytestmark = pytest.mark.timeout(RUN_LIMIT + STOP_LIMIT + 60)
# The default run's sections (``python -m benchmarks --quick``), in four runs of
# ``--only`` that xdist spreads over its workers: run whole, one test took ~90 s idle and
# ~180 s at load 20, the longest single test of the suite's chain. Each part ~15-25 s
# idle (section_seconds in a run's results.json).
PARTS = {
    "startup,steady,lock,watch,cold,placement": (
        "1. start-up",
        "2. steady pass",
        "3. placement lock",
        "4. event → exec",
        "5. memory",
        "6. cold start",
        "7. placement",
    ),
    "verbs,health": ("8. read verbs", "11. health"),
    "replicas,autoscale": ("9. replicas",),
    "pull": ("10. model pull",),
}


def quick(tmp_path: Path, *only: str) -> tuple[str, list[dict[str, Any]], Path]:
    """``python -m benchmarks --quick [--only ...]``: its table, its rows and its run folder."""
    picked = ["--only", ",".join(only)] if only else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks", "--quick", *picked, "--out", str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=RUN_LIMIT)
    except subprocess.TimeoutExpired:
        _, err = _stopped(proc)
        pytest.fail(f"the benchmark ran past {RUN_LIMIT} s and was stopped:\n{err[-4000:]}")
    assert proc.returncode == 0, err[-4000:]
    (run,) = tmp_path.iterdir()
    data = json.loads((run / "results.json").read_text())
    assert data["quick"] is True
    return out, data["rows"], run


def _stopped(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """A benchmark past its limit, stopped by SIGTERM, which runs its clean-up (its
    engines, daemons and supervisord go with it), then its group SIGKILLed: killing it
    alone left the engines it started running with no parent."""
    proc.terminate()
    try:
        return proc.communicate(timeout=STOP_LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()


def test_the_parts_are_the_default_run() -> None:
    """The parts below run every section a plain ``--quick`` runs, each once."""
    from benchmarks.__main__ import DEFAULT

    named = [name for part in PARTS for name in part.split(",")]
    assert sorted(named) == sorted(DEFAULT)


@pytest.mark.parametrize("part", list(PARTS))
def test_the_benchmark_command_runs_with_tiny_n(part: str, tmp_path: Path) -> None:
    table, rows, run = quick(tmp_path, part)
    for section in PARTS[part]:
        assert f"| {section} |" in table, table
    assert {row["section"] for row in rows} == set(PARTS[part])
    assert all(row["ours"] for row in rows), rows
    assert (run / "logs").is_dir()  # the daemon's and supervisord's logs are kept


def test_the_tls_benchmark_runs_with_tiny_n(tmp_path: Path) -> None:
    """``--only tls`` (issue 39): HTTPS and plain rows, each with its ratio."""
    _, rows, _ = quick(tmp_path, "tls")
    assert [row["section"] for row in rows] == ["12. tls", "12. tls"], rows
    assert all(row["ours"] and row["theirs"] and row["ratio"] for row in rows), rows


def test_the_git_benchmark_runs_with_tiny_n(tmp_path: Path) -> None:
    """``--only git`` (issue 37): push → engine exec'd, by webhook and by polling."""
    _, rows, _ = quick(tmp_path, "git")
    assert [row["section"] for row in rows] == ["14. git", "14. git"], rows
    assert ["webhook" in rows[0]["metric"], "polling" in rows[1]["metric"]] == [True, True]
    assert all(len(row["ours"]) == 2 and row["goal"] for row in rows), rows


def test_the_containers_benchmark_runs_with_tiny_n(tmp_path: Path) -> None:
    """``--only containers`` (issue 36): a daemon already watching vs ``podman run`` by
    hand in the foreground (the goal's row) and detached (no goal); it leaves no container
    and no image of its own behind."""
    if shutil.which("podman") is None or shutil.which("busybox") is None:
        missing.skip("podman and a static busybox", "apt-get install podman runc busybox-static")
    _, (row, detached), _ = quick(tmp_path, "containers")
    assert row["section"] == "12. containers" and row["ours"] and row["theirs"], row
    assert row["ratio"] and row["goal"] == "≤ 1.2x", row
    assert detached["ours"] == row["ours"] and detached["theirs"] and not detached["goal"]
    assert "podman run -d" in detached["alt"], detached
    # What the run made: containers labelled with its state dirs, its imported image.
    for what in (["ps", "-a", "--format", "{{.Labels}} {{.Image}}"], ["images"]):
        left = subprocess.run(["podman", *what], capture_output=True, text=True, timeout=120)
        assert left.returncode == 0 and "reconcile-bench" not in left.stdout, left.stdout


@pytest.mark.llama
def test_the_routing_benchmark_runs_with_tiny_n(tmp_path: Path) -> None:
    """``--only routing`` (issue 41): 2 real llama.cpp replicas (marker ``llama``: the
    cached llama-server build; ~8 s) per affinity: TTFT ratios of prefix over none and
    over session, requests per replica, and llama.cpp's own cached-token counts."""
    _, rows, _ = quick(tmp_path, "routing")
    assert [row["section"] for row in rows] == ["15. routing"] * 11, rows
    ttft, spread, cached, cold = rows[:4], rows[4:7], rows[7:10], rows[10]
    for row in ttft:  # 2 families x 2 turns each side, a ratio each
        assert len(row["ours"]) == len(row["theirs"]) == 4 and row["ratio"], row
    assert [row["goal"] for row in ttft] == ["≤ 0.5x", "", "≤ 1.0x", ""], ttft
    for row, mode in zip(spread + cached, ["none", "prefix", "session"] * 2, strict=True):
        assert f"affinity: {mode} (" in row["metric"], row
    assert all(row["ours"][0] >= 1.0 and row["met"] is not None for row in spread), spread
    # session keeps each family on its replica, whose slot holds the first turn: the
    # second turn's prompt begins with it, so llama.cpp reports cached tokens.
    assert cached[2]["ours"][0] > 0, cached
    assert len(cold["ours"]) == 3 * 2, cold  # each mode's 2 first turns


@pytest.mark.parametrize("kind", ["bare", "raw", "asgi", "h1", "work", "served"])
def test_the_python_baselines_pass_answers_on_as_the_engine_gave_them(
    kind: str, tmp_path: Path
) -> None:
    """``benchmarks.gateway``'s Python floors (issue 41: bare aiohttp, the framework's share
    of the gateway's distance from nginx; raw, no framework; asgi, uvicorn's server; h1, a
    server of its own on httptools; work, h1 doing the gateway's work; served, that work on
    the gateway's own server) are proxies: a chat
    completion and its chunked event stream come through as the stand-in engine sent them.
    The work floors do the work: each one's request log has a line per request, with the model
    read from the body and the usage read from the answer."""
    from procs import free_ports, wait_for

    engine_port = free_ports(2)
    proxy_port = engine_port + 1
    bench = REPO / "benchmarks"
    engine = [sys.executable, str(bench / "service_engine.py"), "--port", str(engine_port)]
    proxy = [sys.executable, str(bench / "python_proxies.py"), "--kind", kind]
    proxy += ["--port", str(proxy_port)]
    if kind in ("work", "served"):
        proxy += ["--log-dir", str(tmp_path)]
    procs = [
        subprocess.Popen([*engine, "--service-ms", "0", "--openai"]),
        subprocess.Popen([*proxy, "--upstream", str(engine_port)]),
    ]
    try:

        def post(port: int, stream: bool) -> tuple[int, bytes]:
            body = json.dumps({"model": "hot", "messages": [], "stream": stream}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                             data=body, method="POST")  # fmt: skip
            with urllib.request.urlopen(request, timeout=10) as answer:
                # One length at most: a client stricter than urllib's (aiohttp's) refuses two.
                assert len(answer.headers.get_all("Content-Length") or []) <= 1
                return answer.status, answer.read()

        def up() -> bool:
            try:
                return post(proxy_port, False)[0] == 200
            except OSError:
                return False

        wait_for(up, timeout=30, what="the bare proxy answering")
        for stream in (False, True):
            assert post(proxy_port, stream) == post(engine_port, stream)
        if kind in ("work", "served"):
            log = tmp_path / f"{kind}-requests.jsonl"

            def lines() -> list[dict[str, object]]:
                text = log.read_text() if log.exists() else ""
                return [json.loads(line) for line in text.splitlines()]

            wait_for(lambda: len(lines()) >= 3, timeout=10, what="the work floor's log lines")
            sized = [line for line in lines() if line["model"] == "hot"]
            assert sized and all(line["status"] == 200 for line in sized), lines()
            assert any(line["prompt_tokens"] is not None for line in sized), lines()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def test_the_gateway_benchmark_counts_the_cpu_of_a_listeners_threads(tmp_path: Path) -> None:
    """``benchmarks.gateway``'s CPU per request: the processes listening on a proxy's port
    are found, and the CPU their threads spent is counted, a worker thread's too (the
    figure is the scheduler's, the clock ``time.thread_time`` reads)."""
    from procs import free_ports, wait_for

    from benchmarks.gateway import _cpu_seconds, _listeners

    port = free_ports(1)
    said = tmp_path / "thread-cpu"
    script = (
        "import socket, threading, pathlib, time\n"
        f"s = socket.create_server(('127.0.0.1', {port}))\n"
        "def work():\n"
        "    sum(i * i for i in range(3_000_000))\n"
        f"    pathlib.Path({str(said)!r}).write_text(str(time.thread_time()))\n"
        "    time.sleep(60)  # alive, as a proxy's worker threads are\n"
        "threading.Thread(target=work, daemon=True).start()\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_for(lambda: said.exists() and said.read_text(), timeout=60, what="the thread's work")
        thread = float(said.read_text())
        assert thread > 0.05, thread  # a few hundred ms of work: well past any tick
        assert _listeners(f"http://127.0.0.1:{port}") == [proc.pid]
        assert _cpu_seconds([proc.pid]) >= thread
        assert _cpu_seconds([]) == 0.0
    finally:
        proc.kill()
        proc.wait(10)
