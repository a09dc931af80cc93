"""status/get, describe, logs and devices on real engines, in every output format.

Two deployments: ``web`` (the demo engine on one GPU, with secrets in its spec) and
``crashy`` (prints its cause of death and exits 3, so it restarts and backs off).
"""

from __future__ import annotations

import re
import urllib.request
from datetime import datetime
from typing import Any

import pytest
import yaml

from controller.cli.main import OUTPUT_VERBS

# DESIGN.md's documented fields of `status -o json`, plus the ones issue 6 adds.
FIELDS = {"name", "phase", "pid", "port", "devices", "restarts", "ready", "spec_valid", "message"}
FIELDS |= {"last_exit", "next_retry_at", "source", "revision", "engine", "node", "started_at"}
HEADER = ["NAME", "ENGINE", "NODE", "DEVICES", "PORT", "PHASE", "READY", "RESTARTS", "AGE", "SEEN"]
CRASH = "import sys; print('boom: CUDA out of memory', flush=True); sys.exit(3)"


def _crashed_twice(rc: Any) -> bool:
    rc.once(check=None)
    rec = rc.record("crashy") or {}
    return rec.get("phase") == "BackOff" and rec.get("restarts", 0) >= 1


def _counted(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Status items with a BackOff's "restart in 6s" as "restart in Ns": it is counted at
    the moment each call shows it, so two calls a second apart differ there alone (and
    across its end: "restart in 1s", then "restart due: ...", under load)."""
    back = re.compile(r"restart in \d+s|restart due: the next pass starts it")

    def counted(item: dict[str, Any]) -> dict[str, Any]:
        return {**item, "message": back.sub("restart in Ns", item["message"] or "")}

    # each replica's message too (`instances`): it counted apart, 1 run in 8 under load
    return [{**counted(i), "instances": [counted(r) for r in i["instances"]]} for i in items]


@pytest.fixture
def running(reconcile: Any) -> Any:
    rc = reconcile
    rc.write(
        "web",
        devices={"count": 1, "kind": "nvidia"},
        # a secret's name hides its value; a URL's password is hidden under any name
        env={
            "HF_TOKEN": "hf_s3cr3t",
            "DB_URL": "postgres://u:dbpw-hidden@h/db",
            "PYTHONUNBUFFERED": "1",
        },
        args=["--model", "https://bob:pw-hidden@hub.example/m"],  # a password in a URL
    )
    rc.converge()
    never_ready = {"tcpSocket": {}, "deadlineSeconds": 60, "periodSeconds": 0.2}
    rc.write(
        "crashy", command=["python3", "-c", CRASH], readiness=never_ready, basePort=rc.port + 8
    )
    # --wait keeps one process passing, so it reaps crashy and knows its exit code; the
    # first restart is immediate, the next one 10 s later: the wait times out in between.
    rc("--once", "--wait", "--timeout", "3s", check=1)
    rc.wait_for(lambda: _crashed_twice(rc), timeout=30, what="crashy restarted once")
    yield rc
    rc.down()


def test_status_describe_devices_in_every_format(running: Any) -> None:
    rc = running
    table = rc("status", check=0).out.splitlines()
    assert table[0].split() == [*HEADER, "MESSAGE"]
    rows = {line.split()[0]: line for line in table[1:]}
    web, crashy = rows["web"].split(), rows["crashy"].split()
    assert web[1:8] == ["command", rc.node, "0", str(rc.port), "Ready", "1/1", "0"]
    restarts = rc.record("crashy")["restarts"]
    assert crashy[5:8] == ["BackOff", "0/1", str(restarts)] and crashy[9] == "ago)"
    assert "engine exited with code 3" in rows["crashy"]
    got = rc("get", check=0).out.splitlines()  # the kubectl alias (ages may have ticked)
    assert got[0] == table[0] and [r.split()[:8] for r in got] == [r.split()[:8] for r in table]

    wide = rc("status", "-o", "wide", check=0).out.splitlines()
    assert wide[0].split() == [*HEADER, "PID", "SOURCE", "REVISION", "MESSAGE"]
    web_pid = rc.record("web")["ref"]["pid"]
    assert str(web_pid) in wide[1 + [r.split()[0] for r in wide[1:]].index("web")]

    items = rc("status", "-o", "json", check=0).json()
    assert [i["name"] for i in items] == ["crashy", "web"]
    for item in items:
        assert set(item) >= FIELDS, FIELDS - set(item)
    by = {i["name"]: i for i in items}
    assert by["web"]["ready"] is True and by["web"]["devices"] == ["nvidia:0"]
    assert by["web"]["pid"] == web_pid and by["web"]["spec_valid"] is True
    assert by["web"]["source"] == str(rc.manifests / "web.yaml") and by["web"]["revision"] is None
    assert by["crashy"]["last_exit"]["code"] == 3 and by["crashy"]["ready"] is False
    for stamp in (by["crashy"]["next_retry_at"], by["crashy"]["last_exit"]["at"]):
        assert datetime.fromisoformat(stamp).utcoffset() is not None  # ISO 8601 with a zone
    assert _counted(yaml.safe_load(rc("status", "-o", "yaml", check=0).out)) == _counted(items)
    assert rc("status", "web", "-o", "json", check=0).json() == [by["web"]]
    assert rc("status", "-o", "xml", check=64).err.count("table, wide, json, yaml") == 1
    # One set of engines for all three verbs: keeps the suite fast.
    _describe_redacts_and_keeps_the_cause_of_death(rc)
    _devices_table_and_json(rc)


def _describe_redacts_and_keeps_the_cause_of_death(rc: Any) -> None:
    web = rc("describe", "web", check=0).out
    ours, engine_log = web.split("Log (last 20 lines")  # what the engine prints is its own
    assert "hf_s3cr3t" not in web and "pw-hidden" not in ours
    assert "DB_URL: postgres://u:<redacted>@h/db" in web
    spec = rc("describe", "web", "-o", "json", check=0).out
    assert "dbpw-hidden" not in spec and "hf_s3cr3t" not in spec
    marker = next(line for line in engine_log.splitlines() if "reconcile: start web" in line)
    assert "bob:<redacted>@hub" in marker
    assert "HF_TOKEN: <redacted>" in web and "bob:<redacted>@hub" in web
    flat = [" ".join(line.split()) for line in web.splitlines()]
    for needed in ("Phase: Ready since", "Devices: nvidia:0", "Ready: true", "Events:"):
        assert any(line.startswith(needed) for line in flat), needed
    assert "spawned pid" in web and "ready after" in web
    assert "reconcile: start web instance" in web.split("Log (last 20 lines")[1]

    crashy = rc("describe", "crashy", check=0).out
    assert "Last exit: exited with code 3" in " ".join(crashy.split())
    cause = crashy.split("its last log lines:")[1].split("Spec:")[0]
    assert "boom: CUDA out of memory" in cause
    events = crashy.split("Events:")[1].split("Log (")[0]
    runs = rc.record("crashy")["restarts"] + 1
    assert events.count("spawned pid") == runs and "BackOff" in events and "restart in" in events
    assert rc("describe", "nope", check=1).err.startswith("reconcile: no deployment named 'nope'")


def test_an_unknown_output_format_is_a_usage_error_on_every_verb(reconcile: Any) -> None:
    """DESIGN.md: usage errors exit 64. `source -o xml` and `history -o xml` exited 1, as
    if the state dir had no git source: a script could not tell its slip from a node's."""
    verbs = [[v] for v in OUTPUT_VERBS if v != "describe"]
    for verb in [*verbs, ["describe", "web"], ["logs", "--requests"], ["gateway", "status"]]:
        refused = reconcile(*verb, "-o", "xml", check=None)
        assert refused.code == 64 and "xml" in refused.err, (verb, str(refused))


def test_logs_tail_previous_and_follow(running: Any) -> None:
    rc = running
    runs = rc.record("crashy")["restarts"] + 1  # 2, unless the machine is very slow
    whole = rc("logs", "crashy", check=0).out
    assert whole.count("reconcile: start crashy") == 1
    assert whole.count("reconcile: restart crashy") == runs - 1
    assert whole.splitlines().count("boom: CUDA out of memory") == runs
    assert rc("logs", "crashy", "--tail", "1", check=0).out == "boom: CUDA out of memory\n"
    previous = rc("logs", "crashy", "--previous", check=0).out.splitlines()
    verb = "start" if runs == 2 else "restart"
    assert f"reconcile: {verb} crashy" in previous[0]
    assert previous[1:] == ["boom: CUDA out of memory"]
    assert rc("logs", "web", "--previous", check=1).err.startswith("reconcile: web has no previous")
    assert rc("logs", "nope", check=1).err.startswith("reconcile: no deployment named 'nope'")
    assert rc("logs", "web", "-f", "--previous", check=64).code == 64

    follow, first = rc.follow("web")
    assert b"reconcile: start web" in first, first
    port = rc.record("web")["port"]
    urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
    rc.down()  # the record goes: -f ends by itself, like kubectl logs -f at container exit
    out, _ = follow.communicate(timeout=20)
    assert follow.returncode == 0 and b"GET /v1/models" in out


def _devices_table_and_json(rc: Any) -> None:
    out = rc("devices", check=0).out
    assert out.splitlines()[0] == f"Node {rc.node}: 2 device(s), inventory: static"
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("nvidia")}
    assert rows["nvidia:0"][-1] == "web" and rows["nvidia:1"][-1] == "-"
    ports = {line.split()[0]: line.split()[1] for line in out.splitlines() if line[:1].isdigit()}
    assert ports[str(rc.port)] == "web" and ports[str(rc.port + 8)] == "crashy"

    doc = rc("devices", "-o", "json", check=0).json()
    assert doc["node"] == rc.node and doc["source"] == "static"
    held = {d["device"]: d["held_by"] for d in doc["devices"]}
    assert held == {"nvidia:0": ["web"], "nvidia:1": []}
    assert {d["kind"] for d in doc["devices"]} == {"nvidia"}
    assert {(p["port"], p["held_by"]) for p in doc["ports"]} == {
        (rc.port, "web"),
        (rc.port + 8, "crashy"),
    }
    assert yaml.safe_load(rc("devices", "-o", "yaml", check=0).out) == doc
