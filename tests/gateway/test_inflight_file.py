"""The in-flight figures the autoscaler reads: ``<state>/inflight/<deployment>.<writer>.json``
(store/side/inflight.py), their window average (core/scaling/inflight.py), and the gateway's side:
time-weighted counts (InflightCounts) written once a second per busy deployment (InflightWriter)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from fsevents import Writes

from controller.core.scaling.inflight import Inflight, Sample, average, peak
from controller.gateway.accounting.inflight import InflightCounts, InflightWriter
from controller.store.side import inflight as store

WAIT = 30.0  # seconds a loaded box may take to run the writer's start on a worker thread
WEB = Inflight("web", "101", (Sample(100.0, 1.0, 2.0, 3), Sample(101.0, 1.0, 4.0, 6)))


def test_written_then_read_back(tmp_path: Path) -> None:
    store.write(tmp_path, WEB)
    store.write(tmp_path, Inflight("chat", "202", (Sample(101.0, 1.0, 0.5, 1),)))
    assert store.read_all(tmp_path) == [Inflight("chat", "202", (Sample(101.0, 1.0, 0.5, 1),)), WEB]
    path = tmp_path / "inflight" / "web.101.json"
    assert json.loads(path.read_text())["samples"][1] == {
        "at": 101.0,
        "seconds": 1.0,
        "mean": 4.0,
        "peak": 6,
    }
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("file", "text"),
    [
        ("web.101.json", "{not json"),
        ("web.101.json", '{"version": 9, "deployment": "web", "writer": "101", "samples": []}'),
        (
            "other.101.json",
            json.dumps({"version": 1, "deployment": "web", "writer": "101", "samples": []}),
        ),
        (
            "web.101.json",
            '{"version": 1, "deployment": "web", "writer": "101", "samples": [{"at": 1}]}',
        ),
    ],
)
def test_a_torn_foreign_or_misnamed_file_is_no_load(tmp_path: Path, file: str, text: str) -> None:
    (tmp_path / "inflight").mkdir()
    (tmp_path / "inflight" / file).write_text(text)
    assert store.read_all(tmp_path) == []


@pytest.mark.parametrize(
    ("deployment", "writer"), [("../x", "1"), ("web@1", "1"), ("web", "a.b"), ("web", "")]
)
def test_only_deployment_names_and_tokens_make_file_names(deployment: str, writer: str) -> None:
    with pytest.raises(ValueError, match="not a"):
        store.path_of(Path("/nowhere"), deployment, writer)


def test_forget_and_prune(tmp_path: Path) -> None:
    store.write(tmp_path, WEB)
    store.write(tmp_path, Inflight("web", "202", (Sample(5000.0, 1.0, 1.0, 1),)))
    store.prune(tmp_path, now=5001.0, older_than=3600.0)  # 101's newest ended 4900 s ago
    assert [f.writer for f in store.read_all(tmp_path)] == ["202"]
    store.forget(tmp_path, "202")
    assert store.read_all(tmp_path) == []


@pytest.mark.parametrize(
    ("now", "window", "expected"),
    [
        (101.0, 2.0, 3.0),  # both samples: (2 + 4) / 2
        (101.0, 1.0, 4.0),  # the last one only
        (101.5, 1.0, 2.0),  # half of the window after the last sample: none in flight
        (110.0, 10.0, 0.4),  # the last sample's second and 9 idle ones
        (200.0, 10.0, 0.0),
    ],
)
def test_the_window_average(now: float, window: float, expected: float) -> None:
    other = Inflight("web", "202", (Sample(101.0, 2.0, 1.0, 2),))
    figures = [WEB, Inflight("chat", "101", (Sample(101.0, 1.0, 50.0, 50),))]
    assert average(figures, "web", now, window) == pytest.approx(expected)
    # A second gateway's figures add up (a handover: both serve for a while).
    assert average([*figures, other], "web", 101.0, 2.0) == pytest.approx(4.0)
    assert peak([*figures, other], "web", 101.0, 2.0) == 8


def test_adding_keeps_the_last_samples() -> None:
    figure = Inflight("web", "1")
    for i in range(40):
        figure = figure.adding(Sample(float(i), 1.0, 0.0, 0), kept=30)
    assert len(figure.samples) == 30 and figure.samples[0].at == 10.0


def test_load_is_time_weighted_and_forgets_idle_deployments() -> None:
    now = [0.0]
    load = InflightCounts(clock=lambda: now[0])
    load.add("web", 1)  # one request for the whole second
    now[0] = 0.5
    load.add("web", 1)  # a second one for its second half
    load.add("web", 1)
    load.add("web", -1)
    now[0] = 1.0
    [(name, sample)] = load.take(wall=1000.0)
    assert name == "web" and sample == Sample(1000.0, 1.0, 1.5, 3)
    load.add("web", -2)
    now[0] = 2.0
    assert load.take(wall=1001.0) == [("web", Sample(1001.0, 1.0, 0.0, 2))]  # its peak
    now[0] = 3.0
    assert load.take(wall=1002.0) == []  # idle all along: nothing to write
    assert load.now("web") == 0


def test_the_writer_writes_busy_deployments_only_and_removes_its_files(tmp_path: Path) -> None:
    async def check() -> None:
        load = InflightCounts()
        writer = InflightWriter(tmp_path, load, writer="77")
        load.add("web", 2)
        await writer.flush()
        await writer.flush()
        [figure] = store.read_all(tmp_path)
        assert (figure.deployment, figure.writer, len(figure.samples)) == ("web", "77", 2)
        assert figure.samples[-1].peak == 2 and figure.samples[-1].mean > 0
        load.add("web", -2)
        await writer.flush()  # the last sample: its peak was 2
        await writer.flush()  # idle now: not written again
        assert len(store.read_all(tmp_path)[0].samples) == 3
        running = asyncio.create_task(writer.run())
        await asyncio.sleep(0.05)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert store.read_all(tmp_path) == []

    asyncio.run(check())


def test_the_writer_makes_its_folder_at_its_start_not_in_a_request_s_tail(
    tmp_path: Path,
) -> None:
    """The first request's sample made ``inflight/``, a new entry in the state dir's top
    folder, which the gateway watches for ``drain.json``: its watch threads woke in that
    request's tail (the idle test's held case counted them). The writer makes it at its
    start now: a request's sample writes in ``inflight/`` alone."""

    async def check() -> None:
        load = InflightCounts()
        idle = load.on_busy
        writer = InflightWriter(tmp_path, load, writer="77")
        running = asyncio.create_task(writer.run())
        deadline = time.monotonic() + WAIT
        while load.on_busy is idle:  # its start's job not done yet
            assert time.monotonic() < deadline, "the writer did not start"
            await asyncio.sleep(0.01)
        with Writes(tmp_path) as writes:
            load.add("web", 1)
            load.add("web", -1)
            await writer.flush()
            events = writes.taken()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert [e for e in events if e[0] == "."] == [], events
        assert ("inflight", "web.77.json", "moved_to") in events, events

    asyncio.run(check())


def test_the_writer_s_start_makes_no_state_dir_that_is_gone(tmp_path: Path) -> None:
    """A gateway ends once its state dir is gone: its writer's start must not make it
    again (its folder is made alone, not with its parents)."""

    async def check() -> None:
        load = InflightCounts()
        idle = load.on_busy
        running = asyncio.create_task(InflightWriter(tmp_path / "gone", load, writer="77").run())
        deadline = time.monotonic() + WAIT
        while load.on_busy is idle:
            assert time.monotonic() < deadline, "the writer did not start"
            await asyncio.sleep(0.01)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    asyncio.run(check())
    assert list(tmp_path.iterdir()) == []
