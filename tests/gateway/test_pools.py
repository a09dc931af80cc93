"""Pools through the real daemon and gateway (issue 21): several deployments of one
``spec.model`` all run and share its name, balanced over every instance; each
``metadata.name`` reaches its own engine only; session affinity; an engine killed under
load costs no request; the in-flight figures land in the state dir and the metrics."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from clients import Loop

from controller.store.config import accesstoken

WAIT = 40.0


def pool(reconcile: Any, names: list[str], model: str, **spec: Any) -> None:
    """Deployments of one ``model``: a pool of ``len(names)`` instances."""
    for name in names:
        reconcile.write(name, model=model, **spec)


def ready(g: Any, names: list[str]) -> dict[str, int]:
    """Wait for each deployment to be Ready; its engine's pid."""
    return {name: g.wait_phase(name, "Ready", timeout=WAIT)["pid"] for name in names}


def replicas(name: str, n: int) -> list[str]:
    """The record names of ``n`` replicas: ``web``, ``web@1``, ..."""
    return [name, *(f"{name}@{i}" for i in range(1, n))]


def engine_of(answer: Any) -> str:
    """Which engine process answered (the demo engine's pid)."""
    assert answer.status == 200, answer
    fingerprint: str = answer.json()["system_fingerprint"]
    return fingerprint


def served_by(answer: Any) -> str:
    """The deployment whose engine answered (the demo engine is named after it)."""
    assert answer.status == 200, answer
    model: str = answer.json()["model"]
    return model


def routed(g: Any, model: str, expected: set[str], who: Callable[[Any], str]) -> None:
    """Wait until the gateway has every instance in its table (it re-reads the records
    every 100 ms: Ready in a record may come a moment before the gateway routes to it)."""
    seen: set[str] = set()

    def all_seen() -> bool:
        seen.add(who(g.post(model)))
        return seen >= expected

    g.rc.wait_for(all_seen, timeout=WAIT, what=f"the gateway routing {model} to {expected}")


def spread(send: Callable[[int], Any], n: int, clients: int) -> list[Any]:
    """``n`` requests from ``clients`` threads at once (so in-flight counts differ)."""
    with ThreadPoolExecutor(clients) as workers:
        return list(workers.map(send, range(n)))


def test_two_deployments_of_one_model_both_start_and_serve_it(reconcile: Any, gateway: Any) -> None:
    names = ["left", "right"]
    pool(reconcile, names, "org/shared-7b")
    g = gateway()
    pids = ready(g, names)
    ids = [m["id"] for m in g.request("GET", "/v1/models").json()["data"]]
    assert sorted(ids) == ["left", "org/shared-7b", "right"]  # each name once
    routed(g, "org/shared-7b", set(names), served_by)  # both in the gateway's table first
    answers = spread(lambda _: g.post("org/shared-7b"), 40, 4)
    by = Counter(served_by(a) for a in answers)
    assert set(by) == set(names), by  # the model name is served by both
    # Each metadata.name reaches its own deployment's engine, never the other's.
    for name in names:
        for answer in [g.post(name) for _ in range(10)]:
            assert served_by(answer) == name
            assert answer.json()["system_fingerprint"] == f"pid-{pids[name]}"
    g.finish()


def test_60_requests_over_3_replicas_each_get_some(reconcile: Any, gateway: Any) -> None:
    reconcile.write("trio", replicas=3)
    g = gateway()
    pids = ready(g, replicas("trio", 3))
    routed(g, "trio", {f"pid-{p}" for p in pids.values()}, engine_of)
    engines = {f"pid-{p}" for p in pids.values()}
    # Four at once: each replica gets some. How many follows how fast each answers (least
    # in flight sends fewer to one the box starves: a loaded CI run saw 28/27/5). One at a
    # time every pick is a tie, settled by the counts served so far, the first 30's
    # included: so the 30 after them even out the TOTALS, and one engine served most
    # before rightly gets few now (a CI run saw 15/11/4 here, which the phase alone read
    # as unfair). Simulated from first phases of 10/10/10 to 20/9/1, 100,000 runs each:
    # the least total of 60 was 9 or more, and the totals' spread never passed the first
    # phase's (or 6) by more than 3 (bounds below leave room for the warm-up's few);
    # a tie-break blind to the counts sends 30 to one.
    first = Counter(engine_of(a) for a in spread(lambda _: g.post("trio"), 30, 4))
    assert set(first) == engines, first
    then = Counter(engine_of(a) for a in spread(lambda _: g.post("trio"), 30, 1))
    total = first + then
    assert set(total) == engines and min(total.values()) >= 6, (first, then)
    gap = max(first.values()) - min(first.values())
    assert max(total.values()) - min(total.values()) <= max(gap, 6) + 4, (first, then)
    g.finish()


def test_60_requests_over_3_deployments_of_one_model_each_get_some(
    reconcile: Any, gateway: Any
) -> None:
    names = ["one", "two", "three"]
    pool(reconcile, names, "trio")
    g = gateway()
    ready(g, names)
    routed(g, "trio", set(names), served_by)
    by = Counter(served_by(a) for a in spread(lambda _: g.post("trio"), 60, 4))
    assert set(by) == set(names) and min(by.values()) >= 8, by
    g.finish()


def test_session_affinity_100_sessions_over_4_replicas(reconcile: Any, gateway: Any) -> None:
    reconcile.write("chat", replicas=4, affinity="session")
    g = gateway()
    names = {f"pid-{pid}" for pid in ready(g, replicas("chat", 4)).values()}
    routed(g, "chat", names, engine_of)  # the pool whole in the gateway's table first

    def send(i: int) -> tuple[int, str]:
        # Half the sessions by the header, half by the OpenAI `user` field.
        session = i % 100
        if session % 2:
            answer = g.post("chat", {"x-session-id": f"conv-{session}"})
        else:
            answer = g.post("chat", user=f"user-{session}")
        return session, engine_of(answer)

    where: defaultdict[int, set[str]] = defaultdict(set)
    for session, name in spread(send, 300, 4):  # 3 requests per session
        where[session].add(name)
    assert all(len(found) == 1 for found in where.values()), where
    load = Counter(next(iter(found)) for found in where.values())
    assert set(load) == set(names) and max(load.values()) <= 1.25 * 100 / 4, load
    g.finish()


def test_an_engine_killed_under_4_client_loops_costs_no_request(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("sturdy", replicas=3)
    g = gateway()
    pids = ready(g, replicas("sturdy", 3))
    victim = pids["sturdy@1"]
    with Loop(g, "sturdy").running(4) as loops:
        reconcile.wait_for(
            lambda: (200, f"pid-{victim}") in loops.answers, timeout=WAIT, what="@1 serving"
        )
        os.kill(victim, signal.SIGKILL)
        reconcile.wait_gone(victim)
        seen = len(loops.answers)
        # The restarted engine takes requests again; the others served meanwhile.
        restarted = reconcile.wait_for(
            lambda: _new_pid(reconcile, "sturdy@1", victim), timeout=WAIT, what="@1 restarted"
        )
        reconcile.wait_for(
            lambda: (200, f"pid-{restarted}") in loops.answers[seen:],
            timeout=WAIT,
            what="the restarted @1 serving",
        )
    assert not loops.errors, loops.errors[:5]
    bad = [a for a in loops.answers if a[0] != 200]
    assert not bad, bad[:5]
    assert len(loops.answers) > seen
    assert {p for p in pids.values() if p != victim} <= set(_pids(reconcile, "sturdy", 3))
    g.finish()


def _pids(reconcile: Any, name: str, n: int) -> list[int]:
    status = reconcile.status()
    return [status[record]["pid"] for record in replicas(name, n)]


def _new_pid(reconcile: Any, name: str, old: int) -> int | None:
    item = reconcile.status(name).get(name, {})
    pid = item.get("pid")
    return pid if item.get("phase") == "Ready" and pid not in (None, old) else None


def test_in_flight_figures_reach_the_state_dir_and_the_metrics(
    reconcile: Any, gateway: Any
) -> None:
    # Two clients streaming back to back hold two requests in flight to one instance
    # until both figures are seen, however long that takes.
    reconcile.write("slow", command=reconcile.demo_command(chunks="4", chunk_delay="0.5"))
    metrics_port = reconcile.port + 14
    g = gateway("--metrics-port", str(metrics_port))
    ready(g, ["slow"])
    folder = reconcile.state / "inflight"

    def busy_sample() -> bool:
        for path in folder.glob("slow.*.json"):
            samples = json.loads(path.read_text())["samples"]
            if any(s["peak"] >= 2 and s["mean"] > 0 for s in samples):
                return True
        return False

    def gauge() -> bool:
        token = accesstoken.read(reconcile.state)  # /metrics wants the state dir's token
        url = f"http://127.0.0.1:{metrics_port}/metrics?token={token}"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        labels = f'deployment="slow",instance="slow",node="{reconcile.node}"'
        line = f"reconcile_gateway_inflight{{{labels}}} 2.0"
        return line in text.splitlines()

    with Loop(g, "slow", extra={"stream": True}).running(clients=2) as streams:
        reconcile.wait_for(busy_sample, timeout=WAIT, what="an in-flight sample on disk")
        reconcile.wait_for(gauge, timeout=WAIT, what="the per-instance gauge")
    assert streams.answers and not streams.errors, streams.errors
    assert {status for status, _ in streams.answers} == {200}, streams.answers
    g.finish()
