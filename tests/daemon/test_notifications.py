"""node.yaml ``notify:``: the real daemon posts to a real local receiver (an HTTP server
in the test), retries a hook that fails, and keeps what it queued across a SIGKILL."""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.store.config import accesstoken
from controller.store.lock import FileLock
from controller.store.statedir import StateDir
from tests.hookreceiver import Receiver

CRASH = [sys.executable, "-c", "import sys; sys.exit(3)"]
SECRET = "hf_sekrit_7f3a9c"  # an engine's secret value: never in a payload
HOOK_PASSWORD = "hookpass_91bd"  # the hook's own credentials: never in a payload or a log
HOOK_PATH_TOKEN = "T0KEN8c1e"  # a Slack-style hook: its path is its secret


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    made: list[Receiver] = []
    yield made
    for receiver in made:
        receiver.stop()


def node_yaml(rc: Any, url: str, events: list[str]) -> Path:
    path = rc.tmp / "node.yaml"
    path.write_text(json.dumps({"notify": [{"url": url, "events": events}]}))
    return path


def queued(rc: Any) -> list[dict[str, Any]]:
    """The queue as it is now. A file listed may be gone before it is read: the daemon's
    poster delivers and removes it meanwhile (ci2's FLAKY: FileNotFoundError)."""
    found = []
    for path in sorted((rc.state / "notify").glob("q-*.json")):
        with contextlib.suppress(FileNotFoundError):
            found.append(json.loads(path.read_text()))
    return found


def test_a_failing_hook_is_retried_until_it_accepts(
    reconcile: Any, daemon: Any, finish: Any, receivers: list[Receiver]
) -> None:
    hook = Receiver(reconcile.port + 15, fail_first=2).start()
    receivers.append(hook)
    config = node_yaml(reconcile, f"http://127.0.0.1:{hook.port}/hook", ["Failed"])
    reconcile.write("crash", command=CRASH, restartPolicy="Never", env={"HF_TOKEN": SECRET})
    metrics = reconcile.port + 14
    d = daemon("--node-config", str(config), "--metrics-port", str(metrics))
    d.wait(lambda: hook.accepted, "the notification accepted after two 500s")

    assert len(hook.tries) == 3, hook.tries
    assert len({t["id"] for t in hook.tries}) == 1, "one notification, tried three times"
    body = hook.accepted[0]
    assert body["event"] == "Failed"
    assert body["node"] == reconcile.node
    assert body["source"] == str(reconcile.manifests)
    assert body["deployments"] == ["crash"]
    assert "crash" in body["text"] and "Failed" in body["text"]
    assert SECRET not in json.dumps(hook.tries)
    failures = d.lines("notification not delivered")
    assert [f["attempt"] for f in failures] == [1, 2], d.tail()
    assert any(e["action"] == "notify" for e in reconcile.events("crash"))
    d.wait(lambda: not queued(reconcile), "the delivered file removed")
    counts = _notifications_metric(metrics, accesstoken.read(reconcile.state))
    assert counts == {"delivered": 1.0, "failed": 2.0, "dropped": 0.0}, counts
    finish(d)


def _notifications_metric(port: int, token: str) -> dict[str, float]:
    url = f"http://127.0.0.1:{port}/metrics?token={token}"  # /metrics wants the state dir's
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "reconcile_notifications_total":
                out[sample.labels["result"]] = sample.value
    return out


def test_queued_notifications_survive_a_sigkill_and_go_out_once(
    reconcile: Any, daemon: Any, finish: Any, receivers: list[Receiver]
) -> None:
    port = reconcile.port + 15  # nothing listens there yet: every POST fails
    user = "ops"
    url = f"http://{user}:{HOOK_PASSWORD}@127.0.0.1:{port}/services/{HOOK_PATH_TOKEN}"
    config = node_yaml(reconcile, url, ["Failed", "BackOff"])
    for name in ("one", "two", "three"):
        reconcile.write(name, command=CRASH, restartPolicy="Never", env={"HF_TOKEN": SECRET})
    d = daemon("--node-config", str(config))
    d.wait(lambda: len(queued(reconcile)) == 3, "three notifications queued")
    d.wait(lambda: d.lines("notification not delivered"), "a delivery that failed")
    before = {q["id"] for q in queued(reconcile)}
    d.stop(signal.SIGKILL)

    hook = Receiver(port).start()
    receivers.append(hook)
    again = daemon("--node-config", str(config))
    again.wait(lambda: not queued(reconcile), "the queue emptied by the new daemon")
    again.wait_pass()  # a pass of its own: it queues nothing new for the Failed ones
    again.wait(lambda: not queued(reconcile), "nothing queued by the new daemon's pass")

    ids = Counter(t["id"] for t in hook.tries)
    assert set(ids) == before, (ids, before)
    assert all(n == 1 for n in ids.values()), f"a notification sent twice: {ids}"
    assert sorted(n for t in hook.accepted for n in t["deployments"]) == ["one", "three", "two"]
    want = "Basic " + base64.b64encode(f"{user}:{HOOK_PASSWORD}".encode()).decode()
    assert set(hook.auth) == {want}, "the URL's user:password sent as Basic auth"
    _no_secret_anywhere(reconcile, json.dumps(hook.tries), d, again)
    finish(again)


def _no_secret_anywhere(rc: Any, payloads: str, *daemons: Any) -> None:
    """Neither the engine's secret nor the hook's credentials or path token in a payload;
    the hook's credentials and token in no log and no state-dir file either."""
    for secret in (SECRET, HOOK_PASSWORD, HOOK_PATH_TOKEN):
        assert secret not in payloads, secret
    logs = "".join(d.log.read_text() for d in daemons)
    files = [p for p in rc.state.rglob("*") if p.is_file()]
    for secret in (HOOK_PASSWORD, HOOK_PATH_TOKEN):
        assert secret not in logs, secret
        assert not [p for p in files if secret.encode() in p.read_bytes()], secret


def test_once_posts_what_its_pass_queued_before_it_exits(
    reconcile: Any, receivers: list[Receiver]
) -> None:
    hook = Receiver(reconcile.port + 15).start()
    receivers.append(hook)
    config = node_yaml(reconcile, f"http://127.0.0.1:{hook.port}/hook", ["Failed"])
    reconcile.write("crash", command=CRASH, restartPolicy="Never")
    reconcile("--once", "--wait", "--timeout", "30s", "--node-config", str(config), check=1)
    assert [t["deployments"] for t in hook.accepted] == [["crash"]], hook.tries
    assert not queued(reconcile)
    reconcile.down()


def test_a_device_marked_unhealthy_is_posted_with_what_held_it(
    reconcile: Any, receivers: list[Receiver]
) -> None:
    hook = Receiver(reconcile.port + 15).start()
    receivers.append(hook)
    config = node_yaml(reconcile, f"http://127.0.0.1:{hook.port}/hook", ["Unhealthy"])
    reconcile.devices = "nvidia:0=80Gi,nvidia:1=80Gi"
    fake = reconcile.tmp / "nvml.jsonl"  # the fake NVML source (host/gpuhealth.py)
    reconcile.env["RECONCILE_FAKE_NVML"] = str(fake)
    reconcile.write("web", devices={"count": 1, "kind": "nvidia", "memory": "10Gi"})
    reconcile.converge("--node-config", str(config))
    (held,) = reconcile.status()["web"]["devices"]
    fact = {"device": held, "xid": 79, "time": datetime.now(UTC).isoformat()}
    fake.write_text(json.dumps(fact) + "\n")
    reconcile.converge("--node-config", str(config))
    (told,) = hook.accepted
    assert told["event"] == "Unhealthy" and told["deployments"] == ["web"], told
    assert f"device {held} Unhealthy since" in told["message"] and "Xid 79" in told["message"]
    reconcile.down()


def test_a_crash_loop_is_told_once_not_at_every_restart(
    reconcile: Any, daemon: Any, finish: Any, receivers: list[Receiver]
) -> None:
    hook = Receiver(reconcile.port + 15).start()
    receivers.append(hook)
    config = node_yaml(reconcile, f"http://127.0.0.1:{hook.port}/hook", ["BackOff"])
    reconcile.write("loop", command=CRASH)  # restartPolicy Always: BackOff, restart, ...

    def fails() -> int:
        return len([e for e in reconcile.events("loop") if e["action"] == "fail"])

    d = daemon("--node-config", str(config))
    d.wait(lambda: fails() >= 3, "three crashes of one loop", timeout=90)
    d.wait(lambda: hook.accepted, "the BackOff posted")
    backoffs = [t for t in hook.tries if t["event"] == "BackOff"] + queued(reconcile)
    assert len(backoffs) == 1, backoffs
    assert backoffs[0]["deployments"] == ["loop"] and "BackOff" in backoffs[0]["text"]
    finish(d)


def test_a_notification_another_process_is_posting_is_left_to_it(
    reconcile: Any, receivers: list[Receiver]
) -> None:
    hook = Receiver(reconcile.port + 15).start()
    receivers.append(hook)
    config = node_yaml(reconcile, f"http://127.0.0.1:{hook.port}/hook", ["Failed"])
    reconcile.write("crash", command=CRASH, restartPolicy="Never")
    (reconcile.state / "notify").mkdir(parents=True)
    sender = FileLock(StateDir(reconcile.state).notify_lock)  # as a daemon posting holds it
    with sender.hold():
        reconcile("--once", "--wait", "--timeout", "30s", "--node-config", str(config), check=1)
        assert not hook.tries and len(queued(reconcile)) == 1
    reconcile("--once", "--node-config", str(config), check=1)  # the lock free: posted now
    assert [t["deployments"] for t in hook.tries] == [["crash"]]
    assert not queued(reconcile)
    reconcile.down()
