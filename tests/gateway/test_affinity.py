"""Consistent hashing with bounded loads alone: one instance per session, no instance past
1.25x the mean, and a membership change moves only the sessions it has to."""

from __future__ import annotations

from collections import Counter

import pytest

from controller.gateway.routing.affinity import Ring, Sessions, bound

FOUR = ("web", "web@1", "web@2", "web@3")
SESSIONS = [f"session-{i}" for i in range(100)]


def placed(sessions: Sessions, members: tuple[str, ...]) -> dict[str, str]:
    return {key: sessions.place(key, members) for key in SESSIONS}


@pytest.mark.parametrize(
    ("total", "members", "expected"),
    [
        (100, 4, 32),  # ceil(1.25 x 25): 1.25x the mean, rounded up to a whole one
        (1, 4, 1),  # an even share at least, or a new session would not fit
        (4, 4, 2),
        (8, 4, 3),
        (4, 2, 3),  # two replicas, four requests: the holder may take a third
        (10, 3, 5),
        (0, 2, 0),
    ],
)
def test_the_bound(total: int, members: int, expected: int) -> None:
    assert bound(total, members) == expected


def test_the_ring_walks_every_member_once() -> None:
    ring = Ring(FOUR)
    for start in (0, 2**63, 2**64 - 1):
        walked = list(ring.walk(start))
        assert sorted(walked) == sorted(FOUR)


def test_100_sessions_over_4_stay_put_within_the_bound() -> None:
    sessions = Sessions()
    first = placed(sessions, FOUR)
    for _ in range(3):
        assert placed(sessions, FOUR) == first  # every request of a session: one instance
    held = Counter(first.values())
    assert set(held) == set(FOUR)
    assert max(held.values()) <= 1.25 * len(SESSIONS) / len(FOUR), held
    assert sessions.held == held


def test_an_instance_leaving_moves_its_sessions_only() -> None:
    sessions = Sessions()
    before = placed(sessions, FOUR)
    three = FOUR[:3]
    after = placed(sessions, three)
    moved = {key for key in SESSIONS if before[key] != after[key]}
    assert moved == {key for key in SESSIONS if before[key] == "web@3"}
    held = Counter(after.values())
    assert max(held.values()) <= 1.25 * len(SESSIONS) / 3, held


def test_an_instance_joining_takes_only_what_the_new_bound_sheds() -> None:
    sessions = Sessions()
    before = placed(sessions, FOUR)
    five = (*FOUR, "web@4")
    cap = bound(len(SESSIONS), len(five))
    excess = sum(max(0, n - cap) for n in Counter(before.values()).values())
    after = placed(sessions, five)
    moved = [key for key in SESSIONS if before[key] != after[key]]
    # Only sessions of an instance past the new bound move, one each until it is within.
    assert 0 < len(moved) <= excess
    assert all(Counter(before.values())[before[key]] > cap for key in moved)
    assert max(Counter(after.values()).values()) <= cap
    assert after == placed(sessions, five)  # and then they stay


def test_the_same_key_lands_alike_in_another_gateway() -> None:
    # A successor gateway (a handover) knows no session yet: the ring alone places them.
    assert placed(Sessions(), FOUR) == placed(Sessions(), FOUR)


def test_idle_sessions_and_the_limit_are_forgotten() -> None:
    now = [0.0]
    sessions = Sessions(clock=lambda: now[0], idle=60.0, limit=50)
    placed(sessions, FOUR)
    assert sum(sessions.held.values()) == 50  # the 50 least recently used went first
    assert sessions.where("session-0") is None and sessions.where("session-99") is not None
    now[0] = 61.0
    sessions.place("late", FOUR)
    assert sum(sessions.held.values()) == 1
