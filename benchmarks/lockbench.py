"""3. Placement lock: W processes x C reserve/release cycles against one state dir.

A cycle is what a pass does: take the lock, read every record, pick a free device,
write the reservation record, let go; then take the lock again and drop the record.
Under the lock each worker also counts double bookings (a device in two records):
a correct lock leaves that count at zero.

Two locks run the same cycle: ``controller.lock.FileLock`` (``flock``) and a port of
the seed design's lock (``O_EXCL`` lock file holding the holder's pid, stale when
that pid is dead, 25 ms sleep between tries).

    python -m benchmarks.lockbench worker KIND STATE_DIR WORKER CYCLES DEVICES
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.common import PYTHON, REPO, Row

RETRY_SLEEP = 0.025


# -- the seed design's lock ------------------------------------------------------------------


@contextlib.contextmanager
def excl_lock(path: Path) -> Iterator[None]:
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            holder = _holder(path)
            if holder is not None and not _alive(holder):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # stale: its holder is dead
                continue
            time.sleep(RETRY_SLEEP)
            continue
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
        break
    try:
        yield
    finally:
        path.unlink()


def _holder(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None  # vanished, or not written yet


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- a worker ------------------------------------------------------------------------------


def worker(kind: str, state_dir: Path, me: int, cycles: int, devices: int) -> int:
    bare = kind.endswith("-bare")
    kind = kind.removesuffix("-bare")
    from controller.lock import FileLock
    from controller.records import RecordStore
    from controller.state import Phase, Record

    store = RecordStore(state_dir)
    flock = FileLock(state_dir / "placement.lock", what="placement lock")
    excl = state_dir / "placement.excl"

    def locked() -> contextlib.AbstractContextManager[None]:
        return flock.hold(60) if kind == "flock" else excl_lock(excl)

    double = 0
    inventory = [f"nvidia:{i}" for i in range(devices)]
    print("ready", flush=True)
    sys.stdin.readline()  # the start signal: start-up is not part of the measurement
    if bare:  # the lock alone: nothing read or written while it is held
        for _ in range(2 * cycles):
            with locked():
                pass
        print(0)
        return 0
    for i in range(cycles):
        name = f"w{me}-{i}"
        with locked():
            held: list[str] = []
            for rec in store.load().records.values():
                held.extend(rec.devices)
            double += len(held) - len(set(held))
            device = next(d for d in inventory if d not in held)
            store.write(
                Record(name=name, owner="bench", node="bench", devices=(device,),
                       phase=Phase.RESERVED, port=30000 + me)
            )  # fmt: skip
        with locked():
            store.delete(name)
    print(double)
    return 0


# -- the benchmark ---------------------------------------------------------------------------


def _run(kind: str, workers: int, cycles: int) -> tuple[float, int]:
    """Reservations per second and double bookings counted."""
    with tempfile.TemporaryDirectory(prefix=f"reconcile-bench-lock-{kind}-") as tmp:
        from controller.records import RecordStore

        state = Path(tmp)
        RecordStore(state).ensure()
        argv = [PYTHON, "-m", "benchmarks.lockbench", "worker", kind, str(state)]
        procs = [
            subprocess.Popen(
                [*argv, str(w), str(cycles), str(workers)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            for w in range(workers)
        ]
        for proc in procs:  # every worker has imported and waits for its start signal
            assert proc.stdout is not None
            proc.stdout.readline()
        start = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=600)[0] for proc in procs]
        took = time.perf_counter() - start
        if any(p.returncode for p in procs):
            raise RuntimeError(f"a {kind} lock worker failed: {[p.returncode for p in procs]}")
        return workers * cycles / took, sum(int(out.split()[-1]) for out in outputs)


def bench(workers: int, cycles: int, rounds: int) -> list[Row]:
    ours: list[float] = []
    seed: list[float] = []
    bare: dict[str, list[float]] = {"flock-bare": [], "excl-bare": []}
    doubles = 0
    for _ in range(rounds):
        for kind, rates in (("flock", ours), ("excl", seed)):
            rate, d = _run(kind, workers, cycles)
            rates.append(rate)
            doubles += d
        for kind, rates in bare.items():
            rates.append(_run(kind, workers, cycles)[0])
    row = Row(
        section="3. placement lock",
        metric=f"reservations/s, {workers} procs x {cycles} cycles (double bookings: {doubles})",
        unit="/s",
        ours=ours,
        theirs=seed,
        alt="seed O_EXCL lock, 25 ms retry",
        goal="≥ 20x, 0 double bookings",
    )
    row.met = row.ratio is not None and row.ratio >= 20 and doubles == 0
    lock_alone = Row(
        section="3. placement lock",
        metric="the lock alone: cycles/s (two take/release each), nothing read or written",
        unit="/s",
        ours=bare["flock-bare"],
        theirs=bare["excl-bare"],
        alt="seed O_EXCL lock, 25 ms retry",
    )
    return [row, lock_alone]


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "worker":
        _, _, kind, state, me, cycles, devices = sys.argv
        sys.exit(worker(kind, Path(state), int(me), int(cycles), int(devices)))
    sys.exit(f"usage: {__doc__}")
