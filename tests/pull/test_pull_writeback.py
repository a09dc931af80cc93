"""The download's bytes reach the disk as they arrive: a sync per ``EVERY`` bytes on the
writeback thread, none after ``close``, and a file that cannot sync stops the syncing
quietly (the final fsync is what reports it)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from controller.pull import writeback
from controller.pull.writeback import Writeback


def test_a_sync_follows_every_step_of_bytes_and_none_after_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []  # the file's size at each sync the thread made
    done = threading.Semaphore(0)
    real = os.fdatasync

    def recording(fd: int) -> None:
        real(fd)
        synced.append(os.fstat(fd).st_size)
        done.release()

    monkeypatch.setattr(os, "fdatasync", recording)
    monkeypatch.setattr(writeback, "EVERY", 1000)
    with (tmp_path / "model.partial").open("wb") as out:
        sync = Writeback(out.fileno())
        for step in range(1, 4):
            out.write(b"x" * 1000)
            out.flush()
            sync.wrote(1000)
            assert done.acquire(timeout=10), f"no sync after {step}000 bytes"
        out.write(b"x" * 500)
        sync.wrote(500)  # short of the next step: no sync for it
        sync.close()
    assert synced == [1000, 2000, 3000]
    assert not sync._thread.is_alive()


def test_a_file_that_cannot_sync_ends_the_thread_quietly(tmp_path: Path) -> None:
    read, write = os.pipe()  # a pipe cannot be synced: EINVAL
    try:
        sync = Writeback(write)
        sync.wrote(writeback.EVERY)
        sync._thread.join(timeout=10)
        assert not sync._thread.is_alive()
        sync.close()  # after the thread is gone: returns at once
    finally:
        os.close(read)
        os.close(write)
