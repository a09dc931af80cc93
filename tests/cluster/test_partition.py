"""Faults on the namespace cluster: a worker host cut off (its link down) or killed
outright while its engine serves through the gateway, and the head's reconcile killed
during the move. The deployment must be Ready on another host, the gateway must stop
sending to the lost address, and the old engine must be gone once the host is back:
never two engines of one replica. Measured: seconds to Ready elsewhere, failed requests.
"""

from __future__ import annotations

import time

import pytest
from harness import figures

from .reconcile import Head, Load, ready

SETTLE = 3.0  # seconds of requests after the move: the gateway's table has the new host
CLIENTS = 2


def _host_of(head: Head, address: str) -> str:
    return next(n for n, h in head.net.hosts.items() if h.address == address)


def move(head: Head, replicas: int, fault: str, *, restart_daemon: bool = False) -> None:
    names = ["web"] + [f"web@{i}" for i in range(1, replicas)]
    head.write("web", replicas=replicas)
    head.start()
    recs = head.wait("every replica Ready", lambda r: ready(r, names))
    lost_address = recs["web"].host
    lost = _host_of(head, lost_address)
    assert lost != head.hosts.head and head.engines(lost), (lost, recs)
    load = Load(head.address, "web")
    threads = load.start(CLIENTS)
    head.wait("a request served", lambda _: load.ok > 0)
    try:
        _fault(head, lost, load, fault, restart_daemon=restart_daemon, replicas=replicas)
    finally:
        load.finish(threads)
        head.hosts.lose(lost)  # link up; revived before the next test (the head fixture)


def _fault(
    head: Head, lost: str, load: Load, fault: str, *, restart_daemon: bool, replicas: int
) -> None:
    names = ["web"] + [f"web@{i}" for i in range(1, replicas)]
    lost_address = head.net.hosts[lost].address
    began = time.monotonic()
    if fault == "partition":
        head.net.partition(lost)
    else:
        head.net.kill(lost)
    cut_at = time.monotonic()  # a request sent before this may have reached the lost host
    if restart_daemon:
        head.kill_daemon()
        head.start()
    head.wait("Ready on another host", lambda r: ready(r, names, away_from=lost_address))
    took = time.monotonic() - began
    time.sleep(SETTLE)
    served_after = load.ok
    head.wait("served after the move", lambda _: load.ok > served_after)
    load.stop.set()
    if fault == "partition":
        head.net.heal(lost)
        head.wait("the lost host's engine gone", lambda _: not head.engines(lost))
    hosts = [h for h in head.net.hosts if h != head.hosts.head]
    running = [name for h in hosts for _, name in head.engines(h)]
    assert sorted(running) == sorted(names), running  # one engine per replica, no more
    # No reset crosses a cut link: a request on a connection to the lost host would wait
    # for ever, but the gateway's engine sockets give up in seconds (enginesock.py) before
    # any byte of an answer, so it is retried on another replica. With one replica there
    # is none: those fail (counted), as do requests until the move is over.
    cut = [why for at, why in load.failed if at <= cut_at]
    after = [why for at, why in load.failed if at > cut_at]
    figure = f"{fault} replicas={replicas}: {len(cut)} in flight at the cut, {len(after)} after"
    name = f"cluster_{fault}{'_restart' if restart_daemon else ''}_{replicas}"
    figures.report(
        name,
        replicas=replicas,
        ready_elsewhere_s=round(took, 1),
        requests_ok=load.ok,
        failed_in_flight_at_the_cut=len(cut),
        failed_after=len(after),
    )
    if replicas >= 2:
        assert load.failed == [], (figure, load.failed[:5])


def test_a_partitioned_host_with_two_replicas(head: Head) -> None:
    move(head, 2, "partition")


@pytest.mark.slow
def test_a_partitioned_host_with_one_replica(head: Head) -> None:
    move(head, 1, "partition")


@pytest.mark.slow
def test_a_killed_host(head: Head) -> None:
    move(head, 2, "kill")


@pytest.mark.slow
def test_reconcile_restarted_during_a_move(head: Head) -> None:
    move(head, 2, "partition", restart_daemon=True)
