"""``affinity: prefix`` (issue 41): the prompt's chained block hashes, the index of what
each engine was sent (bounded, forgetting engines that leave), the choice (the longest
match within the bounded load, else least in flight), the spec's default per engine, and
through a real daemon and gateway: a family of prompts lands on one engine."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.engines import default_affinity
from controller.core.manifest.names import base_name
from controller.core.manifest.specs import DeploymentSpec
from controller.core.state import Phase, Record
from controller.gateway.accounting.enginemetrics import EngineLoad
from controller.gateway.routing.affinity import bound
from controller.gateway.routing.prefix import (
    BLOCK_CHARS,
    CAPACITY_MAX,
    MAX_BLOCKS,
    TOKENS_A_BLOCK,
    Prefixes,
    chain,
    prompt_text,
)
from controller.gateway.routing.table import Table


@dataclass(frozen=True)
class Engine:
    nonce: str | None


A, B, C = Engine("a"), Engine("b"), Engine("c")
SYSTEM = "You are a careful assistant for the accounts team. " * 8  # ~400 characters


def chat(*turns: str, system: str = SYSTEM) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}]
    messages += [{"role": "user", "content": t} for t in turns]
    return {"model": "m", "messages": messages}


# -- the prompt and its chain ------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"prompt": "abc"}, "abc"),
        ({"prompt": ["ab", "c"]}, '["ab","c"]'),
        ({"messages": [{"role": "user", "content": "hi"}]}, '{"content":"hi","role":"user"}'),
        ({"messages": []}, ""),
        ({"input": "an embedding"}, None),
        ({"prompt": 7}, None),
    ],
)
def test_prompt_text(fields: dict[str, Any], expected: str | None) -> None:
    assert prompt_text(fields) == expected


def test_a_chat_turn_extends_the_last_ones_chain() -> None:
    first = chain(prompt_text(chat("what is our refund policy?")) or "")
    second = chain(prompt_text(chat("what is our refund policy?", "and for gifts?")) or "")
    other = chain(prompt_text(chat("hi", system="Another system prompt. " * 20)) or "")
    assert len(first) >= 6 and second[: len(first)] == first  # the history is a beginning
    assert not set(other) & set(first)  # chained: no block of another beginning matches


@pytest.mark.parametrize(
    ("text", "blocks"),
    [
        ("", 0),
        ("x" * (BLOCK_CHARS - 1), 0),  # only whole blocks: an engine caches whole blocks
        ("x" * BLOCK_CHARS, 1),
        ("x" * (BLOCK_CHARS * 3 + 5), 3),
        ("x" * (BLOCK_CHARS * (MAX_BLOCKS + 10)), MAX_BLOCKS),
    ],
)
def test_whole_blocks_only_and_at_most_max(text: str, blocks: int) -> None:
    hashes = chain(text)
    assert len(hashes) == blocks and len(set(hashes)) == blocks  # same blocks, new hashes


def test_a_change_in_one_block_changes_that_hash_and_every_later_one() -> None:
    base = "".join(chr(65 + i) * BLOCK_CHARS for i in range(5))
    changed = base[: 2 * BLOCK_CHARS] + "z" + base[2 * BLOCK_CHARS + 1 :]
    one, two = chain(base), chain(changed)
    assert one[:2] == two[:2] and all(x != y for x, y in zip(one[2:], two[2:], strict=True))


# -- the index and the choice ------------------------------------------------------------


def fam(i: int, turns: int = 1) -> tuple[bytes, ...]:
    return chain(prompt_text(chat(*[f"turn {t}" for t in range(turns)], system=f"{i}" * 300)) or "")


@pytest.mark.parametrize(
    ("inflight", "expected"),
    [
        ({}, "b"),  # idle: the holder
        ({"b": 1, "a": 1, "c": 1}, "b"),  # even: the holder
        ({"b": 2, "a": 1, "c": 1}, "b"),  # 3 of 5: within ceil(1.25x the mean), 3
        ({"b": 2, "a": 0, "c": 0}, "a"),  # 3 of 3, past ceil(1.25x 1): least in flight
        ({"b": 4, "a": 4, "c": 4}, "b"),  # 5 of 13: within ceil(1.25x mean), 6
        ({"b": 7, "a": 2, "c": 3}, "a"),  # 8 of 13: past 6
    ],
)
def test_the_holder_unless_past_the_bound(inflight: dict[str | None, int], expected: str) -> None:
    index = Prefixes()
    index.learn("b", fam(1))
    rng = random.Random(1)
    chosen = index.place(fam(1, 2), [A, B, C], inflight, {}, rng)
    total = sum(inflight.values()) + 1
    holder_ok = inflight.get("b", 0) + 1 <= bound(total, 3)
    assert (chosen.nonce == "b") == holder_ok
    if expected == "b":
        assert chosen is B
    else:
        fewest = min(inflight.get(e.nonce, 0) for e in (A, C))
        assert inflight.get(chosen.nonce, 0) == fewest and chosen is not B


@pytest.mark.parametrize(
    ("room", "inflight", "expected"),
    [
        # Two turns in flight on the holder, the others idle: past ceil(1.25x the mean)
        # counted in flight; an engine seen running 4 at once with none waiting is not.
        ({}, {"b": 2}, "a"),
        ({"b": 4}, {"b": 2}, "b"),
        ({"b": 4}, {"b": 3}, "b"),  # its fourth runs at once too
        ({"b": 4}, {"b": 4}, "b"),  # its fifth waits alone: one, the bound rounded up
        ({"b": 4}, {"b": 5}, "a"),  # two would wait, the others idle: past the bound
        ({"b": 4, "a": 4, "c": 4}, {"b": 6, "a": 5, "c": 5}, "b"),  # 3 of 5 waiting: within
    ],
)
def test_the_load_counts_past_what_the_engine_runs_at_once(
    room: dict[str, int], inflight: dict[str | None, int], expected: str
) -> None:
    index = Prefixes()
    index.learn("b", fam(1))
    index.room.update(room)
    chosen = index.place(fam(1, 2), [A, B, C], inflight, {}, random.Random(1))
    assert chosen.nonce == expected


def test_the_room_is_learned_from_the_engines_own_queue() -> None:
    index = Prefixes()
    index.note_queue("b", inflight=3, waiting=0)  # ran 3 at once, nothing waiting
    index.note_queue("b", inflight=1, waiting=0)  # a quieter look teaches nothing less
    assert index.room == {"b": 3}
    index.note_queue("b", inflight=7, waiting=3)  # 3 of our 7 wait: it runs 4 at once
    assert index.room == {"b": 4}
    index.note_queue("b", inflight=2, waiting=5)  # others' requests wait there too
    assert index.room == {"b": 0} and index.load("b", {"b": 2}) == 2
    index.keep(["a"])  # it left the pool: forgotten with its cache
    assert index.room == {}


def test_the_table_hands_each_reading_to_the_index() -> None:
    records = [rec("p", "n0", 8000), rec("p@1", "n1", 8001)]
    table = Table(random.Random(6))
    table.update(records)
    first = table.target("m", prefix=fam(1))
    assert first is not None and first.nonce is not None
    other = "n1" if first.nonce == "n0" else "n0"
    for _ in range(2):  # two turns of the family in flight on its holder
        table.request_began(first.nonce)
    table.engine_read(first.nonce, EngineLoad(0.0, None))  # nothing waiting with 2 of ours
    third = table.target("m", prefix=fam(1, 2))
    assert third is not None and third.nonce == first.nonce
    table.prefixes.room.clear()  # counted in flight alone, the third turn moves
    moved = table.target("m", prefix=fam(1, 3))
    assert moved is not None and moved.nonce == other


def test_the_longest_match_wins() -> None:
    index = Prefixes()
    long, short = fam(2, 4), fam(2, 4)[:3]
    index.learn("a", short)
    index.learn("c", long)
    assert index.place(long, [A, B, C], {}, {}, random.Random(2)) is C
    assert index.match("a", long) == 3 and index.match("b", long) == 0


def test_no_prompt_or_no_holder_is_least_in_flight() -> None:
    index = Prefixes()
    assert index.place((), [A, B, C], {"a": 1, "c": 1}, {}, random.Random(3)) is B
    assert index.place(fam(5), [A, B, C], {"a": 1, "b": 2}, {}, random.Random(3)) is C
    assert index.match("c", fam(5)) == len(fam(5))  # the chosen one learned it


def test_families_stay_together_and_spread() -> None:
    index = Prefixes()
    served: Counter[str | None] = Counter()
    rng = random.Random(4)
    where: defaultdict[int, set[str | None]] = defaultdict(set)
    for turn in range(1, 6):
        for family in range(12):
            chosen = index.place(fam(family, turn), [A, B, C], {}, served, rng)
            served[chosen.nonce] += 1
            where[family].add(chosen.nonce)
    assert all(len(on) == 1 for on in where.values()), where
    assert Counter(next(iter(on)) for on in where.values()) == {"a": 4, "b": 4, "c": 4}


def test_the_tail_of_a_chain_is_evicted_before_its_head() -> None:
    index = Prefixes(capacity=10)
    old, new = fam(7, 3), fam(8)
    assert len(new) < 10 < len(old) + len(new)  # the second chain pushes the first out
    index.learn("a", old)
    index.learn("a", new)
    assert index.blocks() == 10
    kept = index.match("a", old)
    assert 0 < kept < len(old) and kept == 10 - len(new)  # its beginning is what stays


def test_an_engine_stating_a_larger_cache_is_remembered_to_its_size() -> None:
    """vLLM and SGLang state their KV cache's size in tokens: an engine that holds more
    than the default index is remembered to its own size (within ``CAPACITY_MAX``); one
    that holds less keeps the default (the index errs large); a restarted engine (a new
    nonce), or one that left, is forgotten with its size."""
    table = Table(random.Random(3))
    table.update([rec("p", "n0", 8000), rec("p@1", "n1", 8001)])
    index = table.prefixes
    index.capacity = 10
    table.engine_read("n0", EngineLoad(None, 0.1, 60 * TOKENS_A_BLOCK))
    table.engine_read("n1", EngineLoad(None, 0.1, 4 * TOKENS_A_BLOCK))  # less: the default
    assert index.capacity_of("n0") == 60 and index.capacity_of("n1") == 10
    chains = [fam(f) for f in range(8)]
    total = sum(len(each) for each in chains)
    assert 10 < total <= 60
    for each in chains:
        index.learn("n0", each)
        index.learn("n1", each)
    assert index.blocks() == total + 10
    assert all(index.match("n0", each) == len(each) for each in chains)  # none forgotten
    assert index.match("n1", chains[0]) == 0  # the default's ten blocks: the oldest went
    table.engine_read("n0", EngineLoad(None, 0.1, 10**12))
    assert index.capacity_of("n0") == CAPACITY_MAX
    table.update([rec("p@1", "n1", 8001)])  # n0 left the pool
    assert index.capacity_of("n0") == 10 and "n0" not in index.sized


operation = st.one_of(
    st.tuples(st.just("place"), st.integers(0, 7), st.integers(1, 4)),
    st.tuples(st.just("leave"), st.sampled_from("abcd"), st.just(0)),
    st.tuples(st.just("join"), st.sampled_from("abcd"), st.just(0)),
)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(operation, max_size=60),
    loads=st.lists(st.integers(0, 6), min_size=4, max_size=4),
    capacity=st.integers(1, 40),
)
def test_rules_hold_whatever_happens(
    ops: list[tuple[str, Any, int]], loads: list[int], capacity: int
) -> None:
    """The memory bound holds; an engine that left is never chosen and is forgotten; a key
    whose holder is in the pool and within the bound goes to that holder, never elsewhere."""
    index = Prefixes(capacity=capacity)
    inflight: dict[str | None, int] = dict(zip("abcd", loads, strict=True))
    pool = {"a", "b", "c"}
    rng = random.Random(0)
    for kind, what, turns in ops:
        if kind == "leave" and len(pool) > 1:
            pool.discard(what)
            index.keep(pool)
            assert index.engines() <= pool
        elif kind == "join":
            pool.add(what)
        elif kind == "place":
            hashes = fam(what, turns)
            members = [Engine(n) for n in sorted(pool)]
            runs = {m.nonce: index.match(m.nonce or "", hashes) for m in members}
            best = max(runs.values())
            chosen = index.place(hashes, members, inflight, {}, rng)
            assert chosen.nonce in pool
            total = sum(inflight.get(m.nonce, 0) for m in members) + 1
            holders = {n for n, run in runs.items() if run == best and best > 0}
            fit = {n for n in holders if inflight.get(n, 0) + 1 <= bound(total, len(members))}
            if holders and fit == holders:
                assert chosen.nonce in holders
            if not fit:
                fewest = min(inflight.get(m.nonce, 0) for m in members)
                assert inflight.get(chosen.nonce, 0) == fewest
        assert index.blocks() <= capacity * len(index.engines())


# -- through the routing table and the spec ----------------------------------------------


def rec(name: str, nonce: str, port: int, affinity: Any = "prefix") -> Record:
    return Record(
        name=name,
        owner="o",
        node="n",
        nonce=nonce,
        port=port,
        phase=Phase.READY,
        models=(base_name(name), "m"),
        affinity=affinity,
    )


def test_the_table_keeps_a_family_and_forgets_an_engine_that_left() -> None:
    records = [rec("p", "n0", 8000), rec("p@1", "n1", 8001)]
    table = Table(random.Random(6))
    table.update(records)
    first = table.target("m", prefix=fam(1))
    assert first is not None
    for turn in range(2, 6):
        again = table.target("m", prefix=fam(1, turn))
        assert again is not None and again.nonce == first.nonce
    left = next(r for r in records if r.nonce == first.nonce)
    table.update([r for r in records if r is not left])
    assert first.nonce not in table.prefixes.engines()
    for turn in range(1, 6):
        moved = table.target("m", prefix=fam(1, turn))
        assert moved is not None and moved.nonce != first.nonce


@pytest.mark.parametrize(
    ("affinities", "expected"),
    [(("prefix", "none"), "prefix"), (("session", "prefix"), "session"), (("none",), "none")],
)
def test_a_pools_affinity(affinities: tuple[str, ...], expected: str) -> None:
    table = Table()
    table.update([rec(f"d{i}", f"n{i}", 8000 + i, a) for i, a in enumerate(affinities)])
    assert table.affinity("m") == expected


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("vllm", "prefix"),
        ("sglang", "prefix"),
        ("llama-cpp", "prefix"),
        ("tgi", "prefix"),
        ("ollama", "none"),
        ("command", "none"),
        ("no-such-engine", "none"),
    ],
)
def test_the_default_affinity_by_engine(engine: str, expected: str) -> None:
    assert default_affinity(engine) == expected


def test_the_spec_takes_prefix_and_says_what_it_knows() -> None:
    spec = DeploymentSpec.model_validate({"engine": "vllm", "model": "x", "affinity": "prefix"})
    assert spec.affinity == "prefix"
    assert DeploymentSpec.model_validate({"engine": "vllm", "model": "x"}).affinity is None
    with pytest.raises(ValueError, match="'none', 'session' or 'prefix'"):
        DeploymentSpec.model_validate({"engine": "vllm", "model": "x", "affinity": "sticky"})


# -- end to end ----------------------------------------------------------------------------


def test_shared_prefix_requests_land_on_one_engine(reconcile: Any, gateway: Any) -> None:
    """Two demo engines behind a real gateway: every turn of a conversation (its system
    prompt and history a growing beginning) reaches the engine that served the first;
    the conversations spread over both."""
    reconcile.write("fam", replicas=2, affinity="prefix")
    g = gateway()
    pids = {g.wait_phase(n, "Ready")["pid"] for n in ("fam", "fam@1")}
    names = {f"pid-{pid}" for pid in pids}
    seen: set[str] = set()

    def both_routed() -> bool:  # the gateway's table has both (it re-reads the records)
        seen.add(g.post("fam").json()["system_fingerprint"])
        return seen == names

    reconcile.wait_for(both_routed, timeout=40, what="both engines routed")
    where: defaultdict[int, set[str]] = defaultdict(set)
    for family in range(6):
        for turn in range(1, 5):
            body = chat(*[f"question {t}" for t in range(turn)], system=f"Family {family}. " * 40)
            answer = g.post("fam", messages=body["messages"])
            assert answer.status == 200, answer
            assert answer.headers["x-reconcile-deployment"] == "fam"  # who served it
            where[family].add(answer.json()["system_fingerprint"])
    assert all(len(on) == 1 for on in where.values()), where
    assert {next(iter(on)) for on in where.values()} == names
    streamed = g.post("fam", stream=True)  # a streamed answer says who served it too
    assert streamed.status == 200 and b"data:" in streamed.body, streamed
    assert streamed.headers["x-reconcile-deployment"] == "fam"
    g.finish()
