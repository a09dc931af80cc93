"""`status` says how old its view is, looks now on request, shows an emptied folder's
condition, and follows changes with `-w`, through the real CLI (issue 25)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import IO, Any

import pytest

from controller.gateway.ui.snapshot import NodeReader

EMPTY = "no manifest in {} (it is empty): nothing pruned (--allow-empty to prune)"


def _item(rc: Any, *args: str) -> dict[str, Any]:
    (item,) = rc("status", *args, "-o", "json", check=0).json()
    assert isinstance(item, dict)
    return item


def test_status_says_when_it_was_observed_and_refresh_looks_now(reconcile: Any) -> None:
    rc = reconcile
    rc.write("web")
    rc.converge()
    item = _item(rc)
    seen = datetime.fromisoformat(item["observed_at"])
    assert timedelta(0) <= datetime.now(UTC) - seen < timedelta(minutes=5)
    assert rc("status", check=0).out.splitlines()[0].split()[9] == "SEEN"

    pid = item["pid"]
    os.kill(pid, signal.SIGKILL)  # no pass is looking: the last view still says Ready
    rc.wait_gone(pid)
    record = rc.record_path("web").read_bytes()
    assert _item(rc)["phase"] == "Ready"
    now = _item(rc, "--refresh")
    assert now["phase"] == "BackOff" and now["ready"] is False, now
    assert (
        "engine exited" in now["message"] and "status --refresh" in now["message"]
    )  # not its child
    assert datetime.fromisoformat(now["observed_at"]) > seen
    assert "BackOff" in rc("status", "--refresh", check=0).out
    assert rc.record_path("web").read_bytes() == record  # it looked; it wrote nothing
    rc.down()


def test_refresh_shows_what_a_starting_engine_s_probe_answers(reconcile: Any) -> None:
    """An engine Starting with a probe that will never pass (a wrong health path: 404)
    showed no MESSAGE, `--refresh` too, until its deadline (600 s by default) failed it:
    a slow load and a wrong path looked the same. `--refresh` shows the probe's answer."""
    rc = reconcile
    rc.write("web", readiness={"httpGet": {"path": "/nope"}, "periodSeconds": 0.5})
    rc.once(check=None)
    assert _item(rc)["phase"] == "Starting"

    def answered() -> dict[str, Any] | None:
        item = _item(rc, "--refresh")
        return item if "-> 404" in item["message"] else None

    item = rc.wait_for(answered, timeout=60, what="the probe's 404 shown by `status --refresh`")
    assert item["phase"] == "Starting", item
    assert item["message"].startswith("readiness probe: GET /nope -> 404 (seen now"), item
    rc.down()


def test_another_sets_pass_does_not_make_a_record_look_freshly_seen(reconcile: Any) -> None:
    """Two manifest sets on one node: a pass judges only its own set's records, yet a
    cron set's record showed SEEN as old as the other set's (a daemon's) last pass, a few
    seconds, over a record minutes old (still saying `node drained …` after the drain
    ended). A record is as fresh as its own set's last pass."""
    rc = reconcile
    rc.write("web")
    rc.converge()
    mine = _item(rc, "web")["observed_at"]
    other = rc.tmp / "other"
    rc.write("api", folder=other, basePort=rc.port + 20)
    rc("--once", "-f", str(other), check=0)  # another set's pass, later: api's view
    notes = json.loads((rc.state / "observed.json").read_text())
    assert len({n["owner"] for n in notes}) == 2 and max(n["at"] for n in notes) > mine, notes
    assert _item(rc, "web")["observed_at"] == mine  # not the other set's, later look
    assert _item(rc, "api")["observed_at"] > mine
    rc("down", "-f", str(other), check=0)
    rc.down()


def test_an_emptied_folder_is_a_condition_on_its_deployments(reconcile: Any) -> None:
    rc = reconcile
    path = rc.write("web")
    rc.converge()
    assert _item(rc)["conditions"] == []
    path.unlink()  # the last manifest: invariant 5 prunes nothing
    rc.once(check=1)
    item = _item(rc)
    empty = EMPTY.format(rc.manifests)
    assert item["phase"] == "Ready" and item["conditions"] == [empty], item
    assert empty in rc("status", check=0).out
    rc.write("web")
    rc.once()
    assert _item(rc)["conditions"] == []
    rc.down()


def _backing_off(rc: Any) -> dict[str, Any]:
    """``web`` after its second crash in a row: BackOff, "restart in 10s" (the record)."""
    rc.write("web")
    rc.converge()
    for step in (rc.converge, rc.once):  # the first restart is at once, the second waits
        pid = rc.status()["web"]["pid"]
        os.kill(pid, signal.SIGKILL)
        rc.wait_gone(pid)
        step()
    rec = rc.record("web")
    assert rec["phase"] == "BackOff" and rec["message"].endswith("; restart in 10s"), rec
    return rec


def _backoff_until(rc: Any, until: datetime) -> None:
    """The record as the same pass would have left it, its restart due at ``until``."""
    store = rc.store()
    store.write(replace(store.read("web"), backoff_until=until))


def test_a_backoffs_restart_time_is_counted_when_shown(reconcile: Any) -> None:
    """The pass wrote "restart in 10s"; read an hour later (cron's record) it still said
    10s. `status`, `-o json`, `-w`, `describe` and the page count it from the record's
    `backoff_until` when they show it; the record itself is left as written."""
    rc = reconcile
    written = _backing_off(rc)["message"]
    _backoff_until(rc, datetime.now(UTC) - timedelta(hours=1))
    due = written.removesuffix("restart in 10s") + "restart due: the next pass starts it"
    row = next(line for line in rc("status", check=0).out.splitlines() if line.startswith("web"))
    assert row.endswith(due), row
    assert _item(rc)["message"] == due
    assert f"Message:      {due}" in rc("describe", "web", check=0).out
    page = NodeReader(rc.state, rc.node, rc.devices).state(None)["deployments"]
    assert [d["message"] for d in page] == [due]
    watcher = rc.spawn(rc.argv("status", "-w", "-o", "json"), stdout=subprocess.PIPE)
    out = _Lines(watcher.stdout)  # type: ignore[arg-type]
    rc.wait_for(lambda: out.lines, timeout=30)
    assert json.loads(out.lines[0])["message"] == due
    watcher.send_signal(signal.SIGINT)
    watcher.communicate(timeout=30)
    assert rc.record("web")["message"] == written  # a view counts; the record stays

    _backoff_until(rc, datetime.now(UTC) + timedelta(seconds=290))
    later = _item(rc)["message"]
    assert later.removeprefix(written.removesuffix("10s")) in ("4m", "5m"), later
    rc.down()


class _Lines:
    """A process's stdout, read line by line on a thread (no read blocks the test)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            self.lines.append(line.decode())

    def has(self, *words: str) -> bool:
        return any(all(w in line for w in words) for line in self.lines)


def test_watch_of_several_names_prints_them_in_order_and_says_the_unknown(
    reconcile: Any,
) -> None:
    """`status -w web api nope`, as `status web api nope`: the rows in the order given
    (the table's own is by name), nope said once on stderr, the others watched."""
    rc = reconcile
    rc.write("web")
    rc.write("api", basePort=rc.port + 5)
    rc.converge()
    argv = rc.argv("status", "-w", "web", "api", "nope")
    watcher = rc.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = _Lines(watcher.stdout)  # type: ignore[arg-type]
    rc.wait_for(lambda: out.has("web", "Ready") and out.has("api", "Ready"), timeout=30)
    assert [line.split()[0] for line in out.lines[:3]] == ["NAME", "web", "api"], out.lines
    watcher.send_signal(signal.SIGINT)  # Ctrl-C
    _, err = watcher.communicate(timeout=30)
    assert b"Traceback" not in err and watcher.returncode == 130, err
    assert err.decode().count("no deployment named 'nope'") == 1, err
    rc.down()


def test_watch_prints_each_change_and_ends_quietly(reconcile: Any) -> None:
    rc = reconcile
    rc.write("web")
    rc.converge()
    watcher = rc.spawn(rc.argv("status", "-w"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = _Lines(watcher.stdout)  # type: ignore[arg-type]
    rc.wait_for(lambda: out.has("web", "Ready"), timeout=30)
    assert out.lines[0].split()[0] == "NAME"
    rc.write("chat", basePort=rc.port + 5)
    rc.converge()
    rc.wait_for(lambda: out.has("chat", "Ready"), timeout=30)
    assert sum(line.split()[0] == "NAME" for line in out.lines) == 1  # one header
    (rc.manifests / "chat.yaml").unlink()
    rc.once()
    rc.wait_for(lambda: out.has("chat", "(gone)"), timeout=30)
    watcher.send_signal(signal.SIGINT)  # Ctrl-C
    _, err = watcher.communicate(timeout=30)
    assert b"Traceback" not in err and watcher.returncode == 130, err

    piped = subprocess.run(  # the reader goes after one line: the watch ends by itself
        ["bash", "-c", " ".join([*rc.argv("status", "-w", "-o", "json"), "| head -1"])],
        capture_output=True,
        text=True,
        timeout=60,
        env=rc.env,
        cwd=rc.tmp,
    )
    assert piped.returncode == 0 and '"name": "web"' in piped.stdout, piped
    assert "Traceback" not in piped.stderr and "Broken pipe" not in piped.stderr, piped
    rc.down()


def test_watch_names_a_torn_record_once_and_leaves_it(reconcile: Any) -> None:
    """`status -w` reads as `status` does: a torn record is named on stderr (once, not
    every half second) and left where it lies for the next pass."""
    rc = reconcile
    rc.write("web")
    rc.write("chat", basePort=rc.port + 5)
    rc.converge()
    torn = rc.record_path("chat")
    torn.write_text("{")
    watcher = rc.spawn(rc.argv("status", "-w"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = _Lines(watcher.stdout)  # type: ignore[arg-type]
    err = _Lines(watcher.stderr)  # type: ignore[arg-type]
    rc.wait_for(lambda: out.has("web", "Ready") and err.has(str(torn), "cannot be read"))
    (rc.manifests / "web.yaml").unlink()  # a change: the watch looks again, and again
    rc.once("--allow-empty", check=None)
    rc.wait_for(lambda: out.has("web", "(gone)"), timeout=30)
    watcher.send_signal(signal.SIGINT)
    watcher.communicate(timeout=30)
    assert sum(str(torn) in line for line in err.lines) == 1, err.lines
    rc.down()


def test_watch_rows_keep_the_header_s_columns(reconcile: Any) -> None:
    """Each later row was laid out on its own: under a long first name it drifted left
    of the header's columns (issue 34, item 23)."""
    rc = reconcile
    rc.write("a-rather-long-deployment-name")
    rc.converge()
    watcher = rc.spawn(rc.argv("status", "-w"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = _Lines(watcher.stdout)  # type: ignore[arg-type]
    rc.wait_for(lambda: out.has("a-rather-long-deployment-name", "Ready"), timeout=30)
    rc.write("b", basePort=rc.port + 5)
    rc.converge()
    rc.wait_for(lambda: out.has("b ", "Ready"), timeout=30)
    header = out.lines[0]
    rows = [line for line in out.lines if line.startswith("b ")]
    for column, value in (("ENGINE", "command"), ("PHASE", "")):
        at = header.index(column)
        assert all(row[at - 1] == " " and row[at] != " " for row in rows), (header, rows)
        assert all(row[at:].startswith(value) for row in rows), (header, rows)
    watcher.send_signal(signal.SIGINT)
    watcher.communicate(timeout=30)
    rc.down()


@pytest.mark.parametrize("verb", [["events", "-w"], ["logs", "-f", "web"], ["logs", "-f"]])
def test_a_follower_ends_when_its_reader_does(reconcile: Any, verb: list[str]) -> None:
    """`events -w | head -2` (and `logs -f | head -1`) hung until killed when nothing new
    came, where `status -w | head` ends (issue 34, item 23): each ends with the reader."""
    rc = reconcile
    rc.write("web")
    rc.converge()
    follower = rc.spawn(rc.argv(*verb), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert follower.stdout is not None and follower.stderr is not None
    lines = [follower.stdout.readline() for _ in range(2)]  # `| head -2`, then it goes
    follower.stdout.close()
    code = follower.wait(timeout=30)  # the old code never ended: killed at teardown
    with follower.stderr:
        err = follower.stderr.read().decode()
    assert code == 0 and all(lines), (lines, err)
    assert "Traceback" not in err and "Broken pipe" not in err, err
    rc.down()


def test_a_state_dir_that_does_not_exist_is_said(tmp_path: Any) -> None:
    """`status --state-dir` with a slip in the path said `No deployments.` and nothing
    else: a node running nothing, to someone whose daemon runs engines elsewhere."""
    typo = tmp_path / "reconcil"
    for verb, empty in (("status", "No deployments.\n"), ("events", "No events.\n")):
        cmd = [sys.executable, "-m", "controller", "--state-dir", str(typo), verb]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert (result.returncode, result.stdout) == (0, empty), result
        assert f"{typo} does not exist" in result.stderr, result.stderr
    assert not typo.exists()  # looking made nothing
    watching = [sys.executable, "-m", "controller", "--state-dir", str(typo), "status", "-w"]
    with subprocess.Popen(watching, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as w:
        try:  # said at once, before the first table (it watched an empty one for good)
            assert select.select([w.stderr], [], [], 60)[0], "status -w said nothing"
            assert w.stderr is not None and f"{typo} does not exist" in w.stderr.readline()
        finally:
            w.kill()
    made = tmp_path / "state"
    made.mkdir()
    cmd = [sys.executable, "-m", "controller", "--state-dir", str(made), "status"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert (result.stdout, result.stderr) == ("No deployments.\n", ""), result


def test_a_record_whose_cluster_does_not_answer_shows_its_phase_in_doubt(
    reconcile: Any,
) -> None:
    """The daemon marks a Ray record "state unknown since …" when the head is gone
    (reconciler/unreachable.py) and keeps its phase: `status` showed `Ready 1/1` as if
    known. The table's PHASE says `Ready?` and the JSON item `state_known: false` with
    `state_unknown_since`; a local record, an unmarked cluster record and a cleared mark
    show their phase as it is. No Ray: the records are forged, marked by the real writer."""
    from strategies import record

    from controller.core.manifest import backendnames
    from controller.reconciler import unreachable
    from controller.store.lock import FileLock
    from controller.store.side import observed
    from controller.store.statedir import StateDir

    rc = reconcile
    store = rc.store()
    owner = str(rc.manifests)
    cluster = {"backend": backendnames.RAY, "node": "f" * 56, "owner": owner}
    store.write(record("gone", **cluster))
    store.write(record("local", owner=owner, node="gpu-a"))
    lock = FileLock(StateDir(rc.state).pass_lock, what="pass lock")
    before = datetime.now(UTC).replace(microsecond=0)
    assert unreachable.mark(store, lock, owner, "the head at 127.0.0.1:1 is down", 30) == ["gone"]
    store.write(record("other", **{**cluster, "owner": "/another/set"}))  # not marked
    # A condition leads a row's message (an emptied folder): the doubt is still said.
    held = EMPTY.format(rc.manifests)
    observed.note(rc.state, observed.Seen(node="gpu-a", owner=owner, at=before, prune_blocked=held))

    rows = {r.split()[0]: r.split() for r in rc("status", check=0).out.splitlines()[1:]}
    assert rows["gone"][5:7] == ["Ready?", "1/1"], rows
    assert rows["local"][5] == "Ready" and rows["other"][5] == "Ready", rows
    items = {i["name"]: i for i in rc("status", "-o", "json", check=0).json()}
    gone = items["gone"]
    assert gone["phase"] == "Ready" and gone["state_known"] is False, gone
    since = datetime.fromisoformat(gone["state_unknown_since"])
    assert before <= since <= datetime.now(UTC), gone
    assert gone["message"].startswith("state unknown since"), gone
    assert gone["conditions"] == [held], gone
    assert gone["instances"][0]["state_known"] is False, gone
    for name in ("local", "other"):
        assert items[name]["state_known"] is True, items[name]
        assert items[name]["state_unknown_since"] is None, items[name]

    with lock.hold(30):  # a pass reached the cluster: the mark goes
        unreachable.clear(store, dict(store.load().records), owner)
    assert rc("status", "gone", "-o", "json", check=0).json()[0]["state_known"] is True
    assert "Ready?" not in rc("status", check=0).out
