"""Fixtures of the survival harness: a :class:`Cluster` per test, cleaned up after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """One node, one manifest set ("a"); fails the test if engines outlive `down`."""
    node = Cluster(tmp_path)
    yield node
    leftovers = node.close()
    assert not leftovers, f"engines outlived `reconcile down`: {leftovers}"


@pytest.fixture
def two_sets(tmp_path: Path) -> Iterator[Cluster]:
    """One node, two manifest sets ("a", "b": two owners) sharing one GPU inventory."""
    node = Cluster(tmp_path, sets=("a", "b"))
    yield node
    leftovers = node.close()
    assert not leftovers, f"engines outlived `reconcile down`: {leftovers}"
