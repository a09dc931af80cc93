"""The gateway's in-flight samples on disk: ``<state>/inflight/<deployment>.<writer>.json``.

Beside ``activation/``: observed load, written by each gateway process (``writer``: its
own token) about once a second for each deployment it has requests for, read by the
daemon's autoscaler (``controller.core.scaling.inflight.average``). One file per writer, so two
gateways serving at once (a handover) never overwrite each other's figures; a crashed
gateway's file simply ages out of every window, and ``prune`` removes it later. A torn,
foreign or misnamed file is quarantined and counts as no load.

The engines' own figures (``autoscale.metric: waiting | kvCache``) are kept the same
way, one folder per signal: ``<state>/engineload/<signal>/<deployment>.<writer>.json``,
a sample's ``mean`` being the mean over the deployment's instances the gateway read.

```json
{"version": 1, "deployment": "web", "writer": "4242",
 "samples": [{"at": 1764490000.5, "seconds": 1.0, "mean": 3.2, "peak": 5}, ...]}
```
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

from controller.core.manifest.names import is_dns1123
from controller.core.scaling.inflight import Inflight, Sample
from controller.store.documents import Folder, check_version
from controller.store.statedir import StateDir

VERSION = 1
WRITER = re.compile(r"[0-9a-z]{1,40}")
SIGNALS = ("inflight", "waiting", "kvCache")  # fixed folder names, never a user's


def _file_name_ok(stem: str) -> bool:
    # Invariant 9: only deployment names (and a writer token of [0-9a-z]) make file names.
    deployment, _, writer = stem.rpartition(".")
    return is_dns1123(deployment) and WRITER.fullmatch(writer) is not None


def _encode(figure: Inflight) -> dict[str, Any]:
    return {
        "version": VERSION,
        "deployment": figure.deployment,
        "writer": figure.writer,
        "samples": [
            {"at": s.at, "seconds": s.seconds, "mean": s.mean, "peak": s.peak}
            for s in figure.samples
        ],
    }


def _decode(data: Any, stem: str) -> Inflight:
    check_version(data, VERSION)
    deployment, writer = str(data["deployment"]), str(data["writer"])
    if stem != f"{deployment}.{writer}":
        raise ValueError(f"holds {deployment}.{writer}, file says {stem}")
    samples = tuple(
        Sample(float(s["at"]), float(s["seconds"]), float(s["mean"]), int(s["peak"]))
        for s in data["samples"]
    )
    return Inflight(deployment, writer, samples)


def _folder(state_dir: Path, signal: str = "inflight") -> Folder[Inflight]:
    if signal not in SIGNALS:
        raise ValueError(f"not a load signal: {signal!r}")
    state = StateDir(state_dir)
    where = state.inflight if signal == "inflight" else state.engine_load / signal
    return Folder(state, where, _decode, _encode, name_ok=_file_name_ok)


def path_of(state_dir: Path, deployment: str, writer: str, signal: str = "inflight") -> Path:
    if not is_dns1123(deployment):
        raise ValueError(f"not a deployment name: {deployment!r}")
    if WRITER.fullmatch(writer) is None:
        raise ValueError(f"not a writer token: {writer!r}")
    return _folder(state_dir, signal).path(f"{deployment}.{writer}")


def write(state_dir: Path, figure: Inflight, signal: str = "inflight") -> None:
    path_of(state_dir, figure.deployment, figure.writer, signal)  # says which one is wrong
    _folder(state_dir, signal).write(f"{figure.deployment}.{figure.writer}", figure)


def read_all(state_dir: Path, signal: str = "inflight", *, peek: bool = False) -> list[Inflight]:
    """Every readable file; a torn, foreign or misnamed one counts as no load (named;
    quarantined unless ``peek``)."""
    return list(_folder(state_dir, signal).read_all(peek=peek).values())


def forget(state_dir: Path, writer: str, signal: str = "inflight") -> None:
    """A gateway that ends removes its files: its requests are no one's load any more."""
    if WRITER.fullmatch(writer) is None:
        return
    folder = _folder(state_dir, signal)
    for stem, _ in folder.files():
        if stem.endswith(f".{writer}"):
            folder.forget(stem)


def prune(state_dir: Path, now: float, older_than: float, signal: str = "inflight") -> None:
    """Remove files whose newest sample ended more than ``older_than`` seconds ago (a
    crashed gateway's): no window reads them, they only take a directory entry."""
    for figure in read_all(state_dir, signal):
        newest = max((s.at for s in figure.samples), default=0.0)
        if now - newest > older_than:
            with contextlib.suppress(OSError, ValueError):
                path_of(state_dir, figure.deployment, figure.writer, signal).unlink()
