"""Record names: replicas (``web@2``), rolling instances (``web@2@next``), invariant 9."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.core.manifest.names import (
    base_name,
    instance_of,
    is_next,
    next_name,
    record_name_ok,
    replica_name,
    replica_of,
)

BASES = st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)


def test_replica_zero_keeps_the_plain_name() -> None:
    assert replica_name("web", 0) == "web"  # one replica: the records of before
    assert replica_name("web", 1) == "web@1"
    assert replica_name("web", 12) == "web@12"


def test_a_negative_replica_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        replica_name("web", -1)


@pytest.mark.parametrize(
    ("record", "replica", "base", "instance", "nxt"),
    [
        ("web", 0, "web", "web", False),
        ("web@1", 1, "web", "web@1", False),
        ("web@next", 0, "web", "web", True),
        ("web@2@next", 2, "web", "web@2", True),
        ("web--next", 0, "web--next", "web--next", False),  # a user's name like any other
    ],
)
def test_a_record_name_says_its_parts(
    record: str, replica: int, base: str, instance: str, nxt: bool
) -> None:
    assert replica_of(record) == replica
    assert base_name(record) == base
    assert instance_of(record) == instance
    assert is_next(record) is nxt


def test_next_name_suffixes_any_instance() -> None:
    assert next_name("web") == "web@next"
    assert next_name("web@2") == "web@2@next"
    assert instance_of(next_name("web@2")) == "web@2"


@pytest.mark.parametrize("name", ["web", "web@1", "web@10", "web@next", "web@3@next", "a"])
def test_record_names_safe_as_file_names(name: str) -> None:
    assert record_name_ok(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Web",
        "web@0",  # replica 0 is the plain name
        "web@01",  # no leading zero: one record per replica
        "web@-1",
        "web@next@next",
        "web@next@2",  # the rolling suffix comes last
        "web@",
        "@next",
        "@1",
        "web@1@2",
        "../web",
        "web@1/x",
        "a" * 64,
        None,
        7,
    ],
)
def test_other_names_are_refused(name: object) -> None:
    assert not record_name_ok(name)


@given(BASES, st.integers(min_value=0, max_value=10_000), st.booleans())
def test_names_round_trip(base: str, replica: int, rolling: bool) -> None:
    instance = replica_name(base, replica)
    record = next_name(instance) if rolling else instance
    assert record_name_ok(record)
    assert (base_name(record), replica_of(record), is_next(record)) == (base, replica, rolling)
    assert instance_of(record) == instance
