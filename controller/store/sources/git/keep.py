"""The checkout's housekeeping: what a git cut short leaves in the object store, and the
collection of the store once it has grown (``GitSource._collect_when_grown``)."""

from __future__ import annotations

import contextlib
from pathlib import Path

# What a git cut short mid-fetch leaves in the object store: index-pack's pack and index as
# they came, unpack-objects' half-written object. git's gc removes them after two weeks,
# but the node's git runs none (gc.auto=0): each stalled retry left one more, each up to
# the repository's size, on the disk the records live on.
# A gc cut short leaves repack's packs not yet renamed (``pack/.tmp-<pid>-pack-*``).
PARTIAL = ("pack/tmp_*", "pack/.tmp-*", "??/tmp_obj_*", "tmp_obj_*")


# The object store's collection (GitSource._collect_when_grown): never below this size,
# then each time it has doubled since the last (the size then kept in COLLECTED).
COLLECT_MIN = 8 << 20
COLLECTED = "reconcile-collected"
KEEP_REFS = "refs/reconcile/keep"  # one ref per commit a rollback may name


def size_of(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            total += path.stat().st_size if path.is_file() else 0
    return total


def drop_partial(objects: Path) -> None:
    for pattern in PARTIAL:
        for stale in objects.glob(pattern):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()


def remove_tree(path: Path) -> None:
    """``path`` gone, whether a folder or a file (a ``.git`` file: a worktree's link)."""
    import shutil

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
