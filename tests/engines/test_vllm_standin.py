"""`engine: vllm` through the real CLI, with a stand-in `vllm` that reads its command line
with argparse as vLLM's does (a flag's beginning is the flag) and refuses to split the
model over more GPUs than it can see, as vLLM does. Runs on any machine (no GPU)."""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
from pathlib import Path
from typing import Any

from controller.core.manifest.specs import document_hash
from controller.core.state import Phase

# A stand-in `vllm serve MODEL ...`: records its argv (and its --config file's text, as
# read at its start); serves /health, /v1/models listing the served names (else the
# model) and POST /v1/completions, the /v1 paths behind --api-key (else VLLM_API_KEY; else
# HIDDEN_KEY, a name of its own that reconcile cannot know: an engine whose key it lacks);
# each keyed POST is a line of ARGV_FILE.keyed (what its probes presented, counted).
STANDIN = """#!{python}
import argparse, http.server, json, os, sys
with open(os.environ["ARGV_FILE"], "w") as f:
    json.dump(sys.argv, f)
p = argparse.ArgumentParser()  # allow_abbrev, as vLLM's parser
p.add_argument("serve")
p.add_argument("model")
p.add_argument("--host")
p.add_argument("--port", type=int)
p.add_argument("--served-model-name", nargs="+")
p.add_argument("--api-key")
p.add_argument("--api-server-count")  # --api alone is no flag, as in vLLM
p.add_argument("--tensor-parallel-size", type=int, default=1)
p.add_argument("--config")
a, _ = p.parse_known_args()
if a.config:
    with open(a.config) as src, open(os.environ["ARGV_FILE"] + ".config", "w") as dst:
        dst.write(src.read())
gpus = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
if a.tensor_parallel_size > max(len(gpus), 1):
    sys.exit(f"tensor parallel size {{a.tensor_parallel_size}} > {{len(gpus)}} GPUs visible")
names = a.served_model_name or [a.model]
key = a.api_key or os.environ.get("VLLM_API_KEY") or os.environ.get("HIDDEN_KEY")
class H(http.server.BaseHTTPRequestHandler):
    def refused(self):
        keyed = self.headers.get("Authorization") == f"Bearer {{key}}"
        if self.path.startswith("/v1/") and key and not keyed:
            self.send_response(401); self.end_headers(); return True
        return False
    def do_GET(self):
        if self.refused():
            return
        body = json.dumps({{"data": [{{"id": n}} for n in names]}}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.refused():
            return
        if key:
            with open(os.environ["ARGV_FILE"] + ".keyed", "a") as f:
                f.write("POST\\n")
        body = json.dumps({{"choices": [{{"text": "OK", "finish_reason": "stop"}}]}}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer((a.host, a.port), H).serve_forever()
"""


def _standin(
    reconcile: Any, tmp_path: Path, name: str, probe: dict[str, Any] | None = None, **spec: Any
) -> Path:
    """A deployment of the stand-in, probed by the recipe's own checks (or by ``probe``,
    a readiness check of the spec's); its argv file."""
    fake = tmp_path / "vllm"
    if not fake.exists():
        fake.write_text(STANDIN.format(python=sys.executable))
        fake.chmod(0o755)
    argv_file = tmp_path / f"{name}.argv.json"
    reconcile.write(
        name,
        engine="vllm",
        model="tiny",
        executable=str(fake),
        command=None,
        env={"ARGV_FILE": str(argv_file), **spec.pop("env", {})},
        readiness={"deadlineSeconds": 60, "periodSeconds": 0.2, **(probe or {})},
        **spec,
    )
    return argv_file


def test_readiness_reads_the_beginnings_of_served_model_name_and_api_key(
    reconcile: Any, tmp_path: Path
) -> None:
    """`--served-model chat` and `--api-k KEY`, which vLLM reads as the whole flags, left
    readiness waiting for /v1/models to list `tiny`, or asking it without the key, until
    the deadline."""
    _standin(reconcile, tmp_path, "named", args=["--served-model", "chat"])
    _standin(reconcile, tmp_path, "keyed", args=["--api-k", "s3cret"])
    reconcile.converge(timeout="60s")
    status = reconcile.status()
    assert status["named"]["ready"] is True and status["keyed"]["ready"] is True, status
    reconcile.down()


KEY = "sk-probe-9f3c1e"
COMPLETION = {"completion": {}}


def _said(rc: Any, name: str) -> str:
    """All reconcile says of ``name``: status, describe, events, the pass's own output."""
    return "\n".join(
        [
            rc("status", "-o", "json", check=0).out,
            str(rc("describe", name, check=0)),
            json.dumps(rc.events(name)),
            str(rc.once(check=None)),
        ]
    )


def _stays_live(rc: Any, name: str) -> None:
    """``name`` gets Ready, then stays Ready, unrestarted, through two more passes: each
    probes its liveness, and a refused probe would restart it (failureThreshold 1)."""
    rc.converge(timeout="60s")
    before = rc.status()[name]
    assert before["ready"] is True, before
    for _ in range(2):
        rc.once()
    after = rc.status()[name]
    assert after["ready"] is True and after["restarts"] == 0, after
    assert after["pid"] == before["pid"], after


def test_completion_probes_present_the_engines_api_key(reconcile: Any, tmp_path: Path) -> None:
    """A `completion` readiness and liveness probe sent no key: an engine given
    `--api-key` answered 401 every time and never got Ready. The probes present the key
    it was given (in any spelling vLLM reads), and it appears in nothing reconcile says."""
    rc = reconcile
    live = {"completion": {}, "periodSeconds": 0.2, "timeoutSeconds": 10, "failureThreshold": 1}
    _standin(rc, tmp_path, "keyed", COMPLETION, args=["--api-k", KEY], livenessProbe=live)
    _stays_live(rc, "keyed")
    said = _said(rc, "keyed")
    assert "completion" in said and KEY not in said
    rc.down()


def test_a_key_in_spec_env_is_presented_too(reconcile: Any, tmp_path: Path) -> None:
    """vLLM reads VLLM_API_KEY where no --api-key is given: the recipe's anonymous GET of
    /v1/models got 401 until the deadline. The probe presents the key from spec.env."""
    rc = reconcile
    _standin(rc, tmp_path, "envkeyed", env={"VLLM_API_KEY": KEY})
    rc.converge(timeout="60s")
    assert rc.status()["envkeyed"]["ready"] is True
    assert KEY not in _said(rc, "envkeyed")
    rc.down()


def _secrets(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "engine.env"
    path.write_text(text)
    path.chmod(0o600)
    return path


def _no_key_in(state: Path) -> None:
    """No file of the state dir (records, events, logs, caches) holds the key's bytes."""
    held = [p for p in state.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not held, held


def test_a_key_from_envfrom_is_presented_and_never_written(reconcile: Any, tmp_path: Path) -> None:
    """A key from envFrom (VLLM_API_KEY in a `file:`) never reached the probes, since the
    record that held the probe's key may not hold a secret: a `completion` probe got 401
    until the deadline. Each pass finds the key in the values it read; the engine gets
    Ready and stays live through each `--once` (a process of its own), and the key is in
    no file of the state dir, nor in `describe -o json`, the events or what a pass says."""
    rc = reconcile
    secrets = _secrets(tmp_path, f"VLLM_API_KEY={KEY}\n")
    live = {"completion": {}, "periodSeconds": 0.2, "timeoutSeconds": 10, "failureThreshold": 1}
    spec = {"envFrom": [{"file": str(secrets)}], "livenessProbe": live}
    _standin(rc, tmp_path, "fromfile", {**COMPLETION, "deadlineSeconds": 30}, **spec)
    _stays_live(rc, "fromfile")
    said = f"{_said(rc, 'fromfile')}\n{rc('describe', 'fromfile', '-o', 'json', check=0)}"
    assert "completion" in said and KEY not in said
    _no_key_in(rc.state)
    rc.down()


def test_plan_probes_a_starting_engine_with_its_envfrom_key(reconcile: Any, tmp_path: Path) -> None:
    """`plan` probed a Starting engine before it read envFrom's values: a probe with no
    key, refused, so it showed an engine keyed from envFrom Starting where the pass that
    followed found it Ready. It reads them first (as it always did, for the hash) and its
    probe presents the key; the key in nothing it says."""
    rc = reconcile
    secrets = _secrets(tmp_path, f"VLLM_API_KEY={KEY}\n")
    probe = {**COMPLETION, "deadlineSeconds": 600}
    _standin(rc, tmp_path, "starting", probe, envFrom=[{"file": str(secrets)}])
    rc.converge(timeout="60s")
    store = rc.store()
    record = store.read("starting")
    assert record is not None and record.phase is Phase.READY, record
    store.write(dataclasses.replace(record, phase=Phase.STARTING))  # answering, not seen yet
    said: list[str] = []

    def planned_ready() -> bool:  # one probe a plan: a slow answer is tried again
        planned = rc("plan", "-o", "json", check=None)
        said.append(planned.out + planned.err)
        return {"name": "starting", "phase": "Ready"} in json.loads(planned.out)["unchanged"]

    rc.wait_for(planned_ready, timeout=30, what="plan probing the Starting engine with its key")
    assert KEY not in "\n".join(said)
    rc.down()


def _ready(rc: Any, name: str) -> bool:
    return bool(rc.status().get(name, {}).get("ready"))


def _keyed_posts(argv_file: Path) -> int:
    try:
        return len(Path(f"{argv_file}.keyed").read_text().splitlines())
    except FileNotFoundError:
        return 0


def test_the_daemon_presents_a_key_from_envfrom_across_its_restart(
    reconcile: Any, tmp_path: Path
) -> None:
    """The daemon's liveness prober (probes on its own threads) presents a key from
    envFrom too, and a restarted daemon, holding nothing of the old one's memory, finds
    it again: the engine is probed live with it and never restarted as not live."""
    rc = reconcile
    secrets = _secrets(tmp_path, f"VLLM_API_KEY={KEY}\n")
    live = {"completion": {}, "periodSeconds": 0.2, "timeoutSeconds": 10, "failureThreshold": 1}
    spec = {"envFrom": [{"file": str(secrets)}], "livenessProbe": live}
    f = _standin(rc, tmp_path, "daemonkeyed", {**COMPLETION, "deadlineSeconds": 30}, **spec)
    pids = []
    for _ in range(2):  # the daemon, then another after it (SIGTERM leaves engines running)
        enough = _keyed_posts(f) + 5  # Ready, then liveness probes answered
        daemon = rc.daemon("--resync", "1h")
        try:
            rc.wait_for(
                lambda n=enough: _ready(rc, "daemonkeyed") and _keyed_posts(f) > n,
                timeout=60,
                what="keyed liveness probes of a Ready engine",
            )
        finally:
            daemon.send_signal(signal.SIGTERM)
            code = daemon.wait(timeout=30)
        assert code == 0, code
        item = rc.status()["daemonkeyed"]
        assert item["ready"] is True and item["restarts"] == 0, item
        pids.append(item["pid"])
    assert pids[0] == pids[1], pids
    _no_key_in(rc.state)
    rc.down()


def test_a_refused_probe_says_so_and_the_next_move(reconcile: Any, tmp_path: Path) -> None:
    """An engine whose key reconcile cannot know (a variable of its own, from envFrom) said
    only `-> 401` and the body. The probe's answer and the failure say the probe was
    refused, holding no key, and what to do, and name the key nowhere."""
    rc = reconcile
    secrets = _secrets(tmp_path, f"HIDDEN_KEY={KEY}\n")
    probe = {**COMPLETION, "deadlineSeconds": 20}  # time enough for it to listen, loaded
    spec = {"envFrom": [{"file": str(secrets)}], "restartPolicy": "Never"}
    _standin(rc, tmp_path, "hidden", probe, **spec)
    waited = rc("--once", "--wait", "--timeout", "60s", check=1, timeout=90)
    message = rc.status()["hidden"]["message"]
    assert "not ready by its readiness deadline" in message and "-> 401" in message, message
    assert "refused the probe, which presented no API key" in message, message
    assert "spec.args (--api-key), spec.env or envFrom" in message, message
    assert KEY not in f"{waited}\n{_said(rc, 'hidden')}"
    rc.down()


def test_an_abbreviated_api_key_flag_hides_its_value(reconcile: Any, tmp_path: Path) -> None:
    """vLLM reads `--api_k KEY` as `--api-key KEY`, but the redaction looked for KEY in
    the flag's name: `describe` and the log's marker line showed the key."""
    rc = reconcile
    _standin(rc, tmp_path, "abbrev", args=["--api_k", KEY])
    rc.converge(timeout="60s")
    shown = [rc("describe", "abbrev", check=0), rc("logs", "abbrev", check=0)]
    assert all("--api_k" in r.out and "<redacted>" in r.out for r in shown), shown
    assert KEY not in "\n".join(map(str, shown))
    rc.down()


def test_cpu_devices_get_no_tensor_parallel_size(reconcile: Any, tmp_path: Path) -> None:
    """`devices: {kind: cpu, count: 2}` got `--tensor-parallel-size 2`, which vLLM, with
    no GPU to see, refuses: a cpu device is a slot of the node's inventory."""
    reconcile.devices = "cpu:0,cpu:1"
    argv_file = _standin(reconcile, tmp_path, "v", devices={"count": 2, "kind": "cpu"})
    reconcile.converge(timeout="60s")
    assert reconcile.status()["v"]["ready"] is True
    argv = json.loads(argv_file.read_text())
    assert "--tensor-parallel-size" not in argv, argv
    reconcile.down()


def test_an_edited_config_file_restarts_the_engine_with_its_flags(
    reconcile: Any, tmp_path: Path
) -> None:
    """vLLM reads its --config file at its start only, and an edit of the file changed no
    hash: the engine ran on with the old flags. The file's bytes join the hash, as
    envFrom's values do: `plan` names the file, and the pass restarts the engine."""
    rc = reconcile
    flags = tmp_path / "flags.yaml"
    flags.write_text("max-model-len: 4096\n")
    argv_file = _standin(rc, tmp_path, "v", args=["--config", str(flags)])
    read = Path(f"{argv_file}.config")
    rc.converge()
    before = rc.record("v")
    assert read.read_text() == "max-model-len: 4096\n"
    assert rc.once().code == 0 and rc.record("v")["ref"] == before["ref"]  # unchanged: kept

    flags.write_text("max-model-len: 8192\n")
    plan = rc("plan", check=2).out
    assert "vLLM's --config file changed" in plan and "replace" in plan, plan
    rc.converge()
    after = rc.record("v")
    assert after["ref"]["pid"] != before["ref"]["pid"], "an edited --config file restarts"
    assert not rc.alive(before["ref"]["pid"])
    assert read.read_text() == "max-model-len: 8192\n"
    rc.down()


def test_an_upgrade_restarts_no_engine_whose_config_file_is_unchanged(
    reconcile: Any, tmp_path: Path
) -> None:
    """A release before read no --config file into the hash: its record's hash is the spec
    document's alone, and it cannot tell whether the file changed since. Given today's
    hash, the engine kept (an upgrade restarts nothing); an edit after it restarts."""
    rc = reconcile
    flags = tmp_path / "flags.yaml"
    flags.write_text("max-model-len: 4096\n")
    _standin(rc, tmp_path, "v", args=["--config", str(flags)])
    rc.converge()
    pid = rc.record("v")["ref"]["pid"]

    today = _as_before(rc, "v")
    assert rc.once().code == 0
    after = rc.record("v")
    assert after["ref"]["pid"] == pid and rc.alive(pid), "an upgrade restarts no engine"
    assert after["spec_hash"] == today, "the record is given today's hash"

    flags.write_text("max-model-len: 8192\n")  # from now on the hash covers the file
    rc.converge()
    assert rc.record("v")["ref"]["pid"] != pid and not rc.alive(pid), "a change restarts"
    rc.down()


def _as_before(rc: Any, name: str) -> str:
    """The record as a release before --config files were hashed wrote it; the hash it
    held returned."""
    store = rc.store()
    record = store.read(name)
    assert record is not None, name
    old = document_hash(record.stored_spec)
    assert old != record.spec_hash, "the record's hash covers the file"
    store.write(dataclasses.replace(record, spec_hash=old))
    return str(record.spec_hash)
