"""Engine logs: copy-truncate rotation under a live O_APPEND writer, runs, --previous, tail.

The writer is a real process holding its log open with O_APPEND, as an engine does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from procs import wait_for

from controller.store.instances import logfiles

WRITER = """
import sys, time
for i in range(int(sys.argv[1])):
    sys.stdout.write(f"line {i:06d} " + "x" * 60 + "\\n")
    sys.stdout.flush()
    if i % 200 == 0:
        time.sleep(0.005)
"""


def _spawn_writer(log: Path, count: int) -> subprocess.Popen[bytes]:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen([sys.executable, "-c", WRITER, str(count)], stdout=fd)
    finally:
        os.close(fd)


def test_copy_truncate_under_a_live_append_writer(tmp_path: Path) -> None:
    log = tmp_path / "web.log"
    proc = _spawn_writer(log, 60_000)
    rotations = 0
    try:
        while proc.poll() is None:
            rotations += logfiles.rotate(log, max_bytes=64 * 1024, keep=2)
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.wait()
    assert rotations >= 3
    files = logfiles.stream_files(log)
    assert [p.name for p in files] == ["web.log.2", "web.log.1", "web.log"]
    data = b"".join(p.read_bytes() for p in files)
    assert b"\0" not in data  # the writer's next append landed at offset 0: no sparse hole
    numbers = [int(line.split()[1]) for line in data.splitlines()]
    assert numbers == sorted(numbers) and numbers[-1] == 59_999  # in order, newest kept
    assert all(line.startswith(b"line ") for line in data.splitlines())  # no torn join
    assert not (tmp_path / "web.log.3").exists()


def test_rotate_below_the_bound_does_nothing(tmp_path: Path) -> None:
    log = tmp_path / "web.log"
    log.write_bytes(b"short\n")
    assert not logfiles.rotate(log, max_bytes=1024)
    assert not logfiles.rotate(tmp_path / "missing.log", max_bytes=1024)
    assert logfiles.stream_files(log) == [log]


def test_keep_zero_only_truncates(tmp_path: Path) -> None:
    log = tmp_path / "web.log"
    log.write_bytes(b"x" * 2048)
    assert logfiles.rotate(log, max_bytes=1024, keep=0)
    assert log.read_bytes() == b"" and logfiles.stream_files(log) == [log]


def test_runs_previous_and_tail_across_rotated_files(tmp_path: Path) -> None:
    log = tmp_path / "web.log"
    logfiles.write_marker(log, "start web instance a: engine")
    with open(log, "ab") as f:
        f.write(b"".join(b"first run %d\n" % i for i in range(50)))
    logfiles.rotate(log, max_bytes=100, keep=3)  # the first run is now in web.log.1
    with open(log, "ab") as f:
        f.write(b"first run tail\n")
    logfiles.write_marker(log, "restart web instance b: engine")
    with open(log, "ab") as f:
        f.write(b"second run 0\nsecond run 1 (no newline yet)")

    found = logfiles.previous_run(log)
    assert found is not None
    lines, intact = found
    assert intact and logfiles.is_marker(lines[0]) and b"instance a" in lines[0]
    assert lines[-1] == b"first run tail\n" and len(lines) == 52
    tail = logfiles.tail_lines(log, 3)
    assert logfiles.is_marker(tail[0]) and b"instance b" in tail[0]
    assert tail[1:] == [b"second run 0\n", b"second run 1 (no newline yet)"]
    assert logfiles.current_run_tail(log, 10) == ["second run 0", "second run 1 (no newline yet)"]
    assert len(logfiles.tail_lines(log, 1000)) == 1 + 50 + 1 + 1 + 2


def test_previous_is_none_before_any_restart(tmp_path: Path) -> None:
    log = tmp_path / "web.log"
    logfiles.write_marker(log, "start web instance a: engine")
    with open(log, "ab") as f:
        f.write(b"hello\n")
    assert logfiles.previous_run(log) is None


def test_a_run_whose_head_was_rotated_away_says_so(tmp_path: Path) -> None:
    log = tmp_path / "web.log"
    log.write_bytes(b"older lines, marker gone\n")
    logfiles.write_marker(log, "restart web instance b: engine")
    found = logfiles.previous_run(log)
    assert found is not None and found[1] is False


def test_follow_survives_a_copy_truncate(tmp_path: Path) -> None:
    log = tmp_path / "web.log"
    log.write_bytes(b"before\n")
    got: list[bytes] = []
    stop = threading.Event()
    follower = threading.Thread(
        target=logfiles.follow, args=(log, got.append, lambda: not stop.is_set(), 0.02)
    )
    follower.start()
    try:
        time.sleep(0.1)
        with open(log, "ab") as f:
            f.write(b"one\n" * 50)
        wait_for(lambda: b"".join(got).count(b"one") == 50, what="appended lines")
        logfiles.rotate(log, max_bytes=10, keep=1)
        wait_for(lambda: log.stat().st_size == 0, what="truncate")
        time.sleep(0.1)
        with open(log, "ab") as f:
            f.write(b"after rotation\n")
        wait_for(lambda: b"after rotation" in b"".join(got), what="line after the rotation")
    finally:
        stop.set()
        follower.join(timeout=5)
    assert b"before" not in b"".join(got)  # follow starts at the end, like tail -f


def test_follow_reads_what_came_before_it_was_told_to_stop(tmp_path: Path) -> None:
    """An engine's last lines, written between the follower's last read and its look at
    the record (gone with the engine): `logs -f` ended without them."""
    log = tmp_path / "web.log"
    log.write_bytes(b"")
    got: list[bytes] = []

    def keep_going() -> bool:  # the line lands as the instance ends
        with open(log, "ab") as f:
            f.write(b"last words\n")
        return False

    logfiles.follow(log, got.append, keep_going, 0.02)
    assert b"".join(got) == b"last words\n"


def test_a_follow_goes_on_from_where_the_log_so_far_was_read(tmp_path: Path) -> None:
    """`logs -f` reads the log so far, then follows from the end: a line written between
    the two was in neither. Both go from one mark now, each line shown once."""
    log = tmp_path / "web.log"
    log.write_bytes(b"one\ntwo\n")
    mark = logfiles.mark(log)
    with open(log, "ab") as f:
        f.write(b"three\n")  # after the mark: the follow's, not the tail's
    assert logfiles.tail_lines(log, 5, mark) == [b"one\n", b"two\n"]
    got: list[bytes] = []
    logfiles.follow(log, got.append, lambda: False, 0.02, start=mark)
    assert b"".join(got) == b"three\n"


def test_rotate_all_rotates_only_big_logs(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_bytes(b"x" * 5000)
    (tmp_path / "b.log").write_bytes(b"x" * 10)
    assert logfiles.rotate_all(tmp_path, max_bytes=1024, keep=1) == [tmp_path / "a.log"]
    assert (tmp_path / "a.log.1").stat().st_size == 5000


CHATTY = """
import sys, time
i = 0
while True:
    sys.stdout.write(f"chatty {i:08d} " + "y" * 100 + "\\n")
    sys.stdout.flush()
    i += 1
    time.sleep(0.0005)
"""


def test_a_chatty_engine_is_rotated_by_the_pass(reconcile: Any) -> None:
    rc = reconcile
    rc.state.mkdir()
    (rc.state / "node.yaml").write_text("logMaxBytes: 65536\nlogMaxFiles: 2\n")
    never_ready = {"tcpSocket": {}, "deadlineSeconds": 60}
    rc.write("chatty", command=["python3", "-c", CHATTY], readiness=never_ready)
    rc.once()
    log = rc.state / "instances" / "logs" / "chatty.log"
    rc.wait_for(lambda: log.stat().st_size > 65536, what="the log to pass the bound")
    rc.once()
    assert (log.parent / "chatty.log.1").stat().st_size > 65536
    rc.wait_for(lambda: log.stat().st_size > 65536, what="the bound again")
    rc.once()
    assert (log.parent / "chatty.log.2").exists() and not (log.parent / "chatty.log.3").exists()
    last = rc("logs", "chatty", "--tail", "2", check=0).out.splitlines()
    assert len(last) == 2 and all(line.startswith("chatty ") for line in last)
    first = rc("logs", "chatty", check=0).out.splitlines()
    numbers = [int(line.split()[1]) for line in first if line.startswith("chatty ")]
    assert numbers == sorted(numbers)  # backups, oldest first, then the current file
    rc.down()


def test_read_from_picks_up_where_it_left_and_restarts_after_a_rotation(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    assert logfiles.read_from(log, 0) is None  # no log yet
    log.write_bytes(b"one\ntwo\n")
    assert logfiles.read_from(log, 0) == (b"one\ntwo\n", 8)
    with open(log, "ab") as f:
        f.write(b"three\n")
    assert logfiles.read_from(log, 8) == (b"three\n", 14)
    log.write_bytes(b"new\n")  # rotated: shorter than the offset held
    assert logfiles.read_from(log, 14) == (b"new\n", 4)


# An engine that says who it is as it starts, answers and stops (SIGTERM).
TALKER = """
import http.server, os, signal, sys
port, tag = int(sys.argv[1]), sys.argv[2]
def stop(*_):
    print(f"{tag} stops", flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print(f"{tag} answers", flush=True)
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
print(f"{tag} starts", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_a_rolling_update_keeps_each_instances_lines_in_its_own_run(reconcile: Any) -> None:
    """The new instance (``@next``) wrote into the old one's log beside it, so the old
    one's lines from then on, its last ones as it stopped included, were in the new
    one's run, and missing from ``--previous``. Each writes its own file now; the
    promotion hands the new one's over, the old one's behind it."""
    script = reconcile.tmp / "talker.py"
    script.write_text(TALKER)
    for tag in ("v1", "v2"):
        command = [sys.executable, str(script), "{port}", tag]
        reconcile.write("roll", strategy="RollingUpdate", command=command)
        reconcile.converge()
    assert [e["action"] for e in reconcile.events("roll")][-1] == "promote"
    whole = reconcile("logs", "roll", check=0).out
    current = whole[whole.rindex("--- ") :]  # the last run: from its marker line on
    assert "start roll@next" in current and "v2 starts" in current, whole
    assert "v1 " not in current, whole
    previous = reconcile("logs", "roll", "--previous", check=0).out
    assert "v1 starts" in previous and previous.endswith("v1 stops\n"), previous
    logs = reconcile.state / "instances" / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["roll.log", "roll.log.1"]
    reconcile.down()


def test_a_promotion_hands_over_the_new_log_and_its_backups(tmp_path: Path) -> None:
    """Backups of both, newest of the old instance's file behind the new one's; a second
    hand-over (a crash between it and the record's delete: the promote runs again)
    moves nothing."""
    old, new = tmp_path / "web.log", tmp_path / "web@next.log"
    for path, text in [(old, "old 3"), (logfiles.backup(old, 1), "old 2")]:
        path.write_text(f"{text}\n")
    for path, text in [(new, "new 2"), (logfiles.backup(new, 1), "new 1")]:
        path.write_text(f"{text}\n")
    for _ in range(2):
        logfiles.hand_over(new, old, keep=3)
        stream = [p.read_text().strip() for p in logfiles.stream_files(old)]
        assert stream == ["old 2", "old 3", "new 1", "new 2"]
        assert not new.exists() and not logfiles.backup(new, 1).exists()
