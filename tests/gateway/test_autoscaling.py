"""The autoscaler through the real daemon, gateway and engines (issue 21): 1→3 under 12
concurrent slow requests and back to 1 after ``scaleDownDelay``; scale to zero and woken
by a request; the count is state-dir state with an event per change, never the manifest."""

from __future__ import annotations

import json
import os
from typing import Any

from clients import Held, Loop, Stream

from controller.store.statedir import StateDir

WAIT = 60.0
SLOW = {"chunks": "10", "chunk_delay": "0.3"}  # a streamed answer takes ~3 s


def scales(rc: Any, name: str) -> list[str]:
    return [e["reason"] for e in rc.events(name) if e["action"] == "Scale"]


def test_one_to_three_under_load_and_back_to_one(reconcile: Any, gateway: Any) -> None:
    scale = {"min": 1, "max": 3, "targetInflight": 4, "scaleDownDelay": "1s"}
    manifest = reconcile.write("web", autoscale=scale, command=reconcile.demo_command(**SLOW))
    before = manifest.read_text()
    g = gateway()
    first = g.wait_phase("web", "Ready")["pid"]
    assert set(reconcile.status()) == {"web"}  # min 1: one replica until there is load
    with Loop(g, "web", extra={"stream": True}).running(clients=12) as clients:
        for name in ("web@1", "web@2"):
            g.wait_phase(name, "Ready", timeout=WAIT)
        plan = reconcile("plan", check=None)
        assert "web: 3 desired (autoscale 1..3: " in plan.out, plan
    assert clients.answers and not clients.errors, clients.errors
    assert {status for status, _ in clients.answers} == {200}, clients.answers
    ups = scales(reconcile, "web")
    assert ups and ups[0].startswith("scaled 1→"), ups
    assert "in flight on 1 Ready replica, target 4" in ups[0], ups
    stored = json.loads((reconcile.state / "scale" / "web.json").read_text())
    assert stored["count"] == 3
    # No load: after the 10-s window empties and scaleDownDelay passes, back to min.
    reconcile.wait_for(
        lambda: set(reconcile.status()) == {"web"}, timeout=WAIT, what="scaled back to 1"
    )
    assert reconcile.status()["web"]["pid"] == first  # replica 0 untouched
    downs = scales(reconcile, "web")[1:]  # step by step as the 10-s mean decays
    assert downs and downs[-1].split(":")[0].endswith("→1"), downs
    assert all("(scaleDownDelay)" in d for d in downs), downs
    assert manifest.read_text() == before  # the count is never written into the manifest
    g.finish()


def test_scale_to_zero_and_a_request_wakes_it(reconcile: Any, gateway: Any) -> None:
    scale = {"min": 0, "max": 2, "scaleDownDelay": "1s"}
    reconcile.write("nap", autoscale=scale)
    g = gateway()
    g.wait_phase("nap", "Idle")
    assert not reconcile.pids("nap")  # min 0 and no load: nothing runs
    listed = reconcile("status", check=0)
    assert "0/0" in listed.out, listed
    answer = g.post("nap")
    assert answer.status == 200, answer
    assert scales(reconcile, "nap")[0] == "scaled 0→1: a request waits for it"
    g.wait_phase("nap", "Ready", timeout=WAIT)  # Ready until the 10-s window empties
    # The request's load leaves the 10-s window, then 1 s of none: back to zero.
    g.wait_phase("nap", "Idle", timeout=WAIT)
    reconcile.wait_for(lambda: not reconcile.pids("nap"), timeout=WAIT, what="engine gone")
    assert scales(reconcile, "nap")[-1].startswith("scaled 1→0: "), scales(reconcile, "nap")
    g.finish()


def test_scales_on_the_engines_own_requests_waiting(reconcile: Any, gateway: Any) -> None:
    """autoscale.metric: waiting (issue 41): no request reaches the gateway; the demo
    engines state 5 requests waiting each in their /metrics, which asks for 3 replicas at
    target 2; once they state none, back to 1 after scaleDownDelay."""
    said = reconcile.tmp / "waiting-metrics.txt"
    said.write_text("vllm:num_requests_waiting 5\n")
    scale = {"min": 1, "max": 3, "metric": "waiting", "target": 2, "scaleDownDelay": "1s"}
    command = reconcile.demo_command(metrics_file=str(said))
    reconcile.write("web", autoscale=scale, command=command)
    g = gateway()
    g.wait_phase("web", "Ready")
    for name in ("web@1", "web@2"):
        g.wait_phase(name, "Ready", timeout=WAIT)
    ups = scales(reconcile, "web")
    assert ups and ups[0] == "scaled 1→3: 5.0 waiting on 1 Ready replica, target 2", ups
    files = list((reconcile.state / "engineload" / "waiting").glob("web.*.json"))
    assert files and json.loads(files[0].read_text())["samples"][-1]["mean"] == 5.0
    said.write_text("vllm:num_requests_waiting 0\n")
    reconcile.wait_for(
        lambda: set(reconcile.status()) == {"web"}, timeout=WAIT, what="scaled back to 1"
    )
    downs = scales(reconcile, "web")[1:]
    assert downs and "waiting, fewer than" in downs[0] and "(scaleDownDelay)" in downs[0]
    g.finish()
    assert not list((reconcile.state / "engineload" / "waiting").glob("web.*.json"))


def test_a_replica_scaled_away_finishes_the_answers_it_streams(
    reconcile: Any, gateway: Any, held: Held
) -> None:
    """Scaling down (the manifest's replicas, or the autoscaler's count under lower load)
    stopped the highest replica at once: an answer it was streaming through the gateway
    ended mid-way, with no [DONE] and no error. It is drained first now, as a recreate is:
    the gateway sends it nothing new and its answers end, then it stops."""
    slow = held.command()  # its answers end once released
    gpu = {"count": 1, "kind": "nvidia"}
    reconcile.write("pool", replicas=2, devices=gpu, command=slow, stopGracePeriodSeconds=60)
    g = gateway()
    for name in ("pool", "pool@1"):
        g.wait_phase(name, "Ready")
    pids = {f"pid-{reconcile.status()[name]['pid']}" for name in ("pool", "pool@1")}
    streams: list[Stream] = []
    # One after the other: the least in flight puts one on each once the gateway has read
    # both records Ready. Under load its look at the records can come after the record's
    # write that `wait_phase` saw (CI: both streams went to pool@1), so a few more go
    # until each replica streams one; every one must end whole below.
    while {s.pid() for s in streams} != pids and len(streams) < 6:
        streams.append(stream := held.stream(g.port, "pool"))
        reconcile.wait_for(stream.begun.is_set, timeout=WAIT, what="the answer's first chunk")
    assert {s.pid() for s in streams} == pids, [s.body[:300] for s in streams]
    reconcile.write("pool", replicas=1, devices=gpu, command=slow, stopGracePeriodSeconds=60)
    # pool@1's drain asked (a stop at once instead cut its answers: the engine ends at a
    # SIGTERM): it still runs, and the answers are let end
    retire = StateDir(reconcile.state).retire
    reconcile.wait_for(
        lambda: any(retire.glob("*.json")) or not all(s.thread.is_alive() for s in streams),
        timeout=WAIT,
        what="pool@1's drain asked",
    )
    assert all(s.thread.is_alive() for s in streams), [s.body[-300:] for s in streams]
    for pid in pids:
        os.kill(int(pid.removeprefix("pid-")), 0)  # ProcessLookupError: stopped too soon
    held.release()
    reconcile.wait_for(
        lambda: set(reconcile.status()) == {"pool"}, timeout=WAIT * 2, what="scaled down to 1"
    )
    for stream in streams:
        stream.thread.join(timeout=WAIT)
        assert stream.body.rstrip().endswith(b"data: [DONE]"), stream.body[-400:]
    g.finish()
