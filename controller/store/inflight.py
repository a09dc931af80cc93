"""The gateway's in-flight samples on disk: ``<state>/inflight/<deployment>.<writer>.json``.

Beside ``activation/``: observed load, written by each gateway process (``writer``: its
own token) about once a second for each deployment it has requests for, read by the
daemon's autoscaler (``controller.core.scaling.inflight.average``). One file per writer, so two
gateways serving at once (a handover) never overwrite each other's figures; a crashed
gateway's file simply ages out of every window, and ``prune`` removes it later.

```json
{"version": 1, "deployment": "web", "writer": "4242",
 "samples": [{"at": 1764490000.5, "seconds": 1.0, "mean": 3.2, "peak": 5}, ...]}
```
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

from controller.core.manifest.names import is_dns1123
from controller.core.scaling.inflight import Inflight, Sample
from controller.store.records import write_atomic

FOLDER = "inflight"
VERSION = 1
WRITER = re.compile(r"[0-9a-z]{1,40}")


def folder(state_dir: Path) -> Path:
    return state_dir / FOLDER


def path_of(state_dir: Path, deployment: str, writer: str) -> Path:
    # Invariant 9: only deployment names (and a writer token of [0-9a-z]) make file names.
    if not is_dns1123(deployment):
        raise ValueError(f"not a deployment name: {deployment!r}")
    if WRITER.fullmatch(writer) is None:
        raise ValueError(f"not a writer token: {writer!r}")
    return folder(state_dir) / f"{deployment}.{writer}.json"


def write(state_dir: Path, figure: Inflight) -> None:
    path = path_of(state_dir, figure.deployment, figure.writer)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    data = {
        "version": VERSION,
        "deployment": figure.deployment,
        "writer": figure.writer,
        "samples": [
            {"at": s.at, "seconds": s.seconds, "mean": s.mean, "peak": s.peak}
            for s in figure.samples
        ],
    }
    write_atomic(path, json.dumps(data).encode())


def read_all(state_dir: Path) -> list[Inflight]:
    """Every readable file; a torn, foreign or misnamed one counts as no load."""
    out: list[Inflight] = []
    try:
        files = sorted(folder(state_dir).glob("*.json"))
    except OSError:
        return out
    for path in files:
        figure = _read(path)
        if figure is not None:
            out.append(figure)
    return out


def _read(path: Path) -> Inflight | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        data = json.loads(path.read_text())
        deployment, writer = str(data["deployment"]), str(data["writer"])
        if data["version"] != VERSION or path.name != f"{deployment}.{writer}.json":
            return None
        samples = tuple(
            Sample(float(s["at"]), float(s["seconds"]), float(s["mean"]), int(s["peak"]))
            for s in data["samples"]
        )
        return Inflight(deployment, writer, samples)
    return None


def forget(state_dir: Path, writer: str) -> None:
    """A gateway that ends removes its files: its requests are no one's load any more."""
    if WRITER.fullmatch(writer) is None:
        return
    with contextlib.suppress(OSError):
        for path in folder(state_dir).glob(f"*.{writer}.json"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def prune(state_dir: Path, now: float, older_than: float) -> None:
    """Remove files whose newest sample ended more than ``older_than`` seconds ago (a
    crashed gateway's): no window reads them, they only take a directory entry."""
    for figure in read_all(state_dir):
        newest = max((s.at for s in figure.samples), default=0.0)
        if now - newest > older_than:
            with contextlib.suppress(OSError, ValueError):
                path_of(state_dir, figure.deployment, figure.writer).unlink()
