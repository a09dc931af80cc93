"""3. Placement lock: W processes x C reserve/release cycles against one state dir.

A cycle is what a pass does: take the lock, read every record, pick a free device,
write the reservation record (durably), let go; then release it: drop the record
(outside the lock, as the reconciler's teardowns do).
Under the lock each worker also counts double bookings (a device in two records):
a correct lock leaves that count at zero.

Two locks run the same cycle: ``controller.store.lock.FileLock`` (``flock``) and a port of
the seed design's lock (``O_EXCL`` lock file holding the holder's pid, stale when
that pid is dead, 25 ms sleep between tries).

    python -m benchmarks.lockbench worker KIND STATE_DIR WORKER CYCLES DEVICES
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.common import PYTHON, REPO, Row, p95
from controller.store.lock import pid_alive

RETRY_SLEEP = 0.025


# -- the seed design's lock ------------------------------------------------------------------


@contextlib.contextmanager
def excl_lock(path: Path) -> Iterator[None]:
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            holder = _holder(path)
            if holder is not None and not pid_alive(holder):
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


# -- a worker ------------------------------------------------------------------------------


def worker(kind: str, state_dir: Path, me: int, cycles: int, devices: int) -> int:
    """Prints one JSON line: double bookings counted and each acquisition's wait (ms)."""
    bare = kind.endswith("-bare")
    kind = kind.removesuffix("-bare")
    from controller.core.state import Phase, Record
    from controller.store.instances.records import RecordStore
    from controller.store.lock import FileLock

    store = RecordStore(state_dir)
    flock = FileLock(state_dir / "placement.lock", what="placement lock")
    excl = state_dir / "placement.excl"
    waits: list[float] = []

    @contextlib.contextmanager
    def locked() -> Iterator[None]:
        asked = time.perf_counter()
        with flock.hold(60) if kind == "flock" else excl_lock(excl):
            waits.append((time.perf_counter() - asked) * 1000)
            yield

    double = 0
    inventory = [f"nvidia:{i}" for i in range(devices)]
    print("ready", flush=True)
    sys.stdin.readline()  # the start signal: start-up is not part of the measurement
    for i in range(cycles):
        if bare:  # the lock alone: nothing read or written while it is held
            with locked():
                continue
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
        store.delete(name)  # releasing needs no lock (the reconciler's stops take none)
    print(json.dumps({"double": double, "waits": waits}))
    return 0


# -- the benchmark ---------------------------------------------------------------------------


def _run(kind: str, workers: int, cycles: int) -> tuple[float, int, list[float]]:
    """Reservations per second, double bookings counted, every wait for the lock (ms)."""
    with tempfile.TemporaryDirectory(prefix=f"reconcile-bench-lock-{kind}-") as tmp:
        from controller.store.instances.records import RecordStore

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
        results = [json.loads(out.splitlines()[-1]) for out in outputs]
        waits = [w for r in results for w in r["waits"]]
        return workers * cycles / took, sum(r["double"] for r in results), waits


def bench(workers: int, cycles: int, rounds: int) -> list[Row]:
    rates: dict[str, list[float]] = {k: [] for k in ("flock", "excl", "flock-bare", "excl-bare")}
    waits: dict[str, list[float]] = {k: [] for k in rates}
    doubles = 0
    for _ in range(rounds):
        for kind in rates:
            rate, double, waited = _run(kind, workers, cycles)
            rates[kind].append(rate)
            waits[kind] += waited
            doubles += double
    alt = "seed O_EXCL lock, 25 ms retry"
    section = "3. placement lock"
    row = Row(
        section=section,
        metric=f"reservations/s, {workers} procs x {cycles} cycles (double bookings: {doubles})",
        unit="/s",
        ours=rates["flock"],
        theirs=rates["excl"],
        alt=alt,
        goal="≥ 20x, 0 double bookings",
    )
    row.met = row.ratio is not None and row.ratio >= 20 and doubles == 0
    return [
        row,
        _waits(section, "wait for the lock, per reservation", waits["flock"], waits["excl"], alt),
        Row(section, "the lock alone: take/release pairs/s, nothing read or written", "/s",
            rates["flock-bare"], rates["excl-bare"], alt),
        _waits(section, "the lock alone: wait per take", waits["flock-bare"], waits["excl-bare"],
               alt),
    ]  # fmt: skip


def _waits(section: str, what: str, ours: list[float], seed: list[float], alt: str) -> Row:
    """Waits are about the tail: the ratio is of the p95s, the metric names p99 and max."""
    p99 = f"p99 {_pct(ours, 99):.1f} vs {_pct(seed, 99):.1f}"
    tail = f"{p99}, max {max(ours):.0f} vs {max(seed):.0f}"
    ratio = p95(ours) / p95(seed) if p95(seed) > 0 else None
    return Row(section, f"{what} ({tail}; ratio of p95s)", "ms", ours, seed, alt, ratio=ratio)


def _pct(xs: list[float], pct: int) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, -(-pct * len(s) // 100) - 1))]


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "worker":
        _, _, kind, state, me, cycles, devices = sys.argv
        sys.exit(worker(kind, Path(state), int(me), int(cycles), int(devices)))
    sys.exit(f"usage: {__doc__}")
