"""spec.envFrom end to end (DESIGN.md "Secrets"): the real CLI and daemon, real engines,
the real ``sops`` with an ``age-keygen`` key. A value reaches the engine's environment and
no output, no state-dir file; a changed value restarts the engine; a file that cannot be
used leaves the deployment Pending, naming the file, and a running engine as it was.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from agekey import AgeKey, make_key

from controller.core.manifest.specs import document_hash, with_secrets
from controller.host import secrets
from controller.store.config import accesstoken
from tests.engines.test_vllm_standin import COMPLETION, KEY, _no_key_in, _said, _standin

METRICS = 14  # the metrics port: the test's port block + 14 (the gateway's is + 15)


def _secret(what: str) -> str:
    """A value no output could hold by chance."""
    return f"{what}-{uuid.uuid4().hex}"


def _private(path: Path, text: str) -> Path:
    """A node's secrets file, 0600 as the contract asks."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path


def _outputs(rc: Any, g: Any, pid: int) -> dict[str, str]:
    """Every output a user or a scraper can read, by where it came from."""
    token = accesstoken.read(rc.state)
    places: dict[str, str] = {}
    for verb in (
        ("status",),
        ("status", "-o", "json"),
        ("status", "-o", "wide"),
        ("describe", "web"),
        ("events", "web"),
        ("logs", "web"),
        ("plan",),
        ("plan", "-o", "json"),
        ("export",),
    ):
        result = rc(*verb, check=0)
        places[f"reconcile {' '.join(verb)}"] = result.out + result.err
    metrics = f"http://127.0.0.1:{rc.port + METRICS}/metrics?token={token}"
    with urllib.request.urlopen(metrics, timeout=30) as answer:
        places["/metrics"] = answer.read().decode()
    for path in ("/ui/api/state", "/ui/api/logs/web", "/v1/models", "/healthz"):
        answer = g.request("GET", f"{path}?token={token}")
        assert answer.status == 200, (path, answer)
        places[f"GET {path}"] = answer.body.decode()
    places["daemon log"] = g.text()
    places["engine argv"] = " ".join(rc.cmdline(pid))
    for file in sorted(rc.state.rglob("*")):
        if file.is_file():
            places[str(file)] = file.read_bytes().decode(errors="replace")
    return places


def test_values_reach_the_engine_and_nowhere_else(
    reconcile: Any, gateway: Any, age_key: AgeKey
) -> None:
    rc = reconcile
    on_node, in_repo = _secret("hf"), _secret("api")
    node_file = _private(
        rc.tmp / "node" / "hf.env",
        f'# the hub token\nexport HF_TOKEN="{on_node}"  # read on the node\nPLAIN=not-secret\n',
    )
    age_key.encrypt(f"API_KEY='{in_repo}'\n", rc.manifests / "secrets" / "api.env")
    rc.env["SOPS_AGE_KEY_FILE"] = str(age_key.file)
    items = [{"file": str(node_file)}, {"sopsFile": "secrets/api.env"}]
    rc.write("web", envFrom=items, image="python:3.12-slim")  # the image: for export
    g = gateway("--metrics-port", str(rc.port + METRICS))
    g.wait_phase("web", "Ready")
    pid = rc.record("web")["ref"]["pid"]
    env = rc.environ(pid)
    assert (env["HF_TOKEN"], env["API_KEY"], env["PLAIN"]) == (on_node, in_repo, "not-secret")

    places = _outputs(rc, g, pid)
    exported = places["reconcile export"]
    assert "secretRef" in exported and "web-env" in exported, exported
    assert "kubectl create secret generic web-env" in exported, exported
    hits = [(where, s) for where, text in places.items() for s in (on_node, in_repo) if s in text]
    assert hits == [], hits
    files = sum(1 for where in places if where.startswith("/"))
    print(f"secret grep: {len(places)} places ({files} state-dir files), 0 hits")
    assert files > 5, places.keys()  # records, events, logs... were there to grep
    g.finish()


def test_a_changed_secret_restarts_the_engine(reconcile: Any, age_key: AgeKey) -> None:
    rc = reconcile
    first, second = _secret("one"), _secret("two")
    node_file = _private(rc.tmp / "node" / "token.env", f"TOKEN={first}\n")
    rc.write("web", envFrom=[{"file": str(node_file)}])
    rc.converge()
    before = rc.record("web")
    assert rc.environ(before["ref"]["pid"])["TOKEN"] == first
    assert rc.once().code == 0 and rc.record("web")["ref"] == before["ref"]  # unchanged: kept

    _private(node_file, f"TOKEN={second}\n")
    plan = rc("plan", check=None)
    assert "envFrom" in plan.out and first not in plan.out + plan.err, str(plan)
    rc.converge()
    after = rc.record("web")
    assert after["ref"]["pid"] != before["ref"]["pid"], "a changed secret restarts the engine"
    assert not rc.alive(before["ref"]["pid"])
    assert rc.environ(after["ref"]["pid"])["TOKEN"] == second
    assert after["spec_hash"] != before["spec_hash"]
    journal = json.dumps(rc.events("web"))
    assert "envFrom" in journal and first not in journal and second not in journal, journal
    rc.down()


def _unkeyed(rc: Any, name: str, values: dict[str, str]) -> str:
    """A record as the release before the secrets key wrote it: ``values``' unkeyed
    digest in its hash (sha256 over the sorted items), the hash it held returned."""
    store = rc.store()
    record = store.read(name)
    assert record is not None, name
    old = with_secrets(document_hash(record.stored_spec), secrets.unkeyed_digest(values))
    assert old != record.spec_hash, "the record's hash is keyed"
    store.write(dataclasses.replace(record, spec_hash=old))
    return str(record.spec_hash)


def test_the_secrets_digest_is_keyed_and_an_upgrade_restarts_nothing(
    reconcile: Any, age_key: AgeKey
) -> None:
    rc = reconcile
    value = _secret("pw")
    node_file = _private(rc.tmp / "node" / "token.env", f"TOKEN={value}\n")
    rc.write("web", envFrom=[{"file": str(node_file)}])
    rc.converge()
    key = rc.state / "secrets-key"
    assert key.stat().st_mode & 0o777 == 0o600, oct(key.stat().st_mode)
    pid = rc.record("web")["ref"]["pid"]

    keyed = _unkeyed(rc, "web", {"TOKEN": value})  # an upgrade finds the old hash
    assert rc.once().code == 0
    after = rc.record("web")
    assert after["ref"]["pid"] == pid and rc.alive(pid), "an upgrade restarts no engine"
    assert after["spec_hash"] == keyed, "the record is given the keyed hash"
    assert not any(e.get("action") == "replace" for e in rc.events("web")), rc.events("web")

    _unkeyed(rc, "web", {"TOKEN": value})  # an old record whose secret then changed
    _private(node_file, f"TOKEN={_secret('new')}\n")
    rc.converge()
    assert rc.record("web")["ref"]["pid"] != pid and not rc.alive(pid), "a change restarts"
    rc.down()


def _broken(case: str, rc: Any, key: AgeKey, value: str) -> tuple[dict[str, str], Any]:
    """An envFrom item that works now, and what breaks it later."""
    if case == "undecryptable":
        key.encrypt(f"API_KEY={value}\n", rc.manifests / "secrets" / "api.env")
        other = make_key(rc.tmp / "other-keys", "other")  # a node key that is no recipient

        def undecryptable() -> None:
            rc.env["SOPS_AGE_KEY_FILE"] = str(other.file)

        return {"sopsFile": "secrets/api.env"}, undecryptable
    path = _private(rc.tmp / "node" / "api.env", f"API_KEY={value}\n")
    return {"file": str(path)}, path.unlink if case == "missing" else lambda: path.chmod(0o644)


@pytest.mark.parametrize("case", ["missing", "readable by others", "undecryptable"])
def test_an_unusable_secret_is_pending_and_leaves_a_running_engine(
    reconcile: Any, age_key: AgeKey, case: str
) -> None:
    rc = reconcile
    value = _secret("api")
    rc.env["SOPS_AGE_KEY_FILE"] = str(age_key.file)
    item, breakage = _broken(case, rc, age_key, value)
    rc.write("web", envFrom=[item])
    rc.converge()
    before = rc.record("web")
    breakage()
    rc.write("fresh", envFrom=[item])
    result = rc.once(check=1)  # not in sync: the error says so, and where
    # The file as the manifest names it: a node path as is, a sopsFile as written.
    named = item.get("file") or f"sopsFile {item['sopsFile']} "
    assert "spec.envFrom[0]: " in result.err and named in result.err, str(result)
    status = rc.status(cli=True)
    assert status["fresh"]["phase"] == "Pending" and named in status["fresh"]["message"]
    assert not rc.pids("fresh")
    web = rc.record("web")
    assert web["phase"] == "Ready" and named in web["message"], web
    assert web["ref"] == before["ref"] and rc.alive(before["ref"]["pid"])
    assert web["restarts"] == before["restarts"] and web["spec_hash"] == before["spec_hash"]
    shown = result.out + result.err + json.dumps(status)
    assert value not in shown, shown
    rc.down()


def test_envfrom_items_are_checked_where_they_are_written(reconcile: Any) -> None:
    rc = reconcile
    rc.write(
        "web",
        envFrom=[
            {"file": "relative.env"},
            {"file": "/etc/a.env", "sopsFile": "b.env"},
            {"sopsFile": "../outside.env"},
            {"sopsFile": "secrets/../../outside.env"},
            {"sopsFile": "/abs.env"},
            {},
        ],
    )
    result = rc("plan", check=None)
    assert result.code != 0, str(result)
    err = result.out + result.err
    file = rc.manifests / "web.yaml"
    lines = file.read_text().splitlines()
    first = next(i for i, line in enumerate(lines, 1) if "relative.env" in line)
    expected = [
        (0, "must be an absolute path on the node"),
        (1, "exactly one of file"),
        (2, "leaves the manifests folder"),
        (3, "leaves the manifests folder"),
        (4, "must be relative to the manifest"),
        (5, "exactly one of file"),
    ]
    for index, words in expected:
        assert f"spec.envFrom[{index}]: " in err and words in err, err
    assert f"{file}:{first}: spec.envFrom[0]: " in err, err
    assert "Traceback" not in err


def test_validate_finds_a_sops_file_the_repository_lacks_without_a_key(
    reconcile: Any, age_key: AgeKey, tmp_path: Path
) -> None:
    """A CI job's `validate` has no age key: it passed a commit whose sopsFile path had a
    typo (or whose encrypted file was never committed), which every node then refused, its
    source Degraded saying "`reconcile validate` lists every error". It names each sopsFile
    missing beside its manifest, or leaving its folder, and decrypts none (no key needed)."""
    rc = reconcile
    rc.env.pop("SOPS_AGE_KEY_FILE", None)  # the CI job's environment
    age_key.encrypt("API_KEY=never-read\n", rc.manifests / "secrets" / "web.env")
    rc.write("web", envFrom=[{"sopsFile": "secrets/web.env"}])
    assert "1 deployment(s) in 1 file(s): valid" in rc("validate", check=0).out
    rc.write("web", envFrom=[{"sopsFile": "secrets/web.env"}, {"sopsFile": "secrets/api.env"}])
    out = rc("validate", check=1)
    file = rc.manifests / "web.yaml"
    line = next(i for i, x in enumerate(file.read_text().splitlines(), 1) if "api.env" in x)
    said = f"{file}:{line}: spec.envFrom[1]: sopsFile secrets/api.env does not exist beside"
    assert said in out.err and "envFrom[0]" not in out.err, out
    elsewhere = age_key.encrypt("API_KEY=never-read\n", tmp_path / "elsewhere" / "api.env")
    (rc.manifests / "secrets" / "api.env").symlink_to(elsewhere)  # a link out of the folder
    out = rc("validate", check=1)
    assert "spec.envFrom[1]: sopsFile secrets/api.env leaves the manifests folder" in out.err
    assert "never-read" not in out.out + out.err


def test_a_value_tampered_with_in_the_encrypted_file_says_so(
    reconcile: Any, age_key: AgeKey
) -> None:
    """A corrupted value (an edit by hand, a bad merge of the encrypted file) fails AES-GCM's
    check: sops' words were not shown (they may quote a value) and ours said only to run
    `sops -d FILE`; they now say what happened and the next move, still with no value."""
    rc = reconcile
    value = _secret("token")
    sealed = age_key.encrypt(f"TOKEN={value}\n", rc.manifests / "secrets" / "app.env")
    text = sealed.read_text()
    start = text.index("data:") + len("data:")
    swapped = "B" if text[start] == "A" else "A"  # still base64, same length: a new value
    sealed.write_text(text[:start] + swapped + text[start + 1 :])
    rc.env["SOPS_AGE_KEY_FILE"] = str(age_key.file)
    rc.write("web", envFrom=[{"sopsFile": "secrets/app.env"}])
    result = rc.once(check=1)
    said = result.out + result.err
    assert "sopsFile secrets/app.env cannot be decrypted" in said, said
    assert "a value does not decrypt" in said and "changed outside sops" in said, said
    assert value not in said and value[:8] not in json.dumps(rc.status(cli=True))
    assert rc.status(cli=True)["web"]["phase"] == "Pending" and not rc.pids("web")


def test_an_envfrom_key_reconcile_sets_itself_is_refused_naming_the_file_and_key(
    reconcile: Any, age_key: AgeKey
) -> None:
    """spec.env may not set PORT or CUDA_VISIBLE_DEVICES (engineenv.py), but a secrets
    file could, and the placement replaced its value without a word. A file's keys are
    known when a pass reads it: such a start is Pending, naming the file, the key and
    the field to use; a running engine keeps running; `plan` says the same."""
    rc = reconcile
    value = _secret("token")
    node_file = _private(rc.tmp / "node" / "web.env", f"TOKEN={value}\n")
    rc.write("web", envFrom=[{"file": str(node_file)}])
    rc.converge()
    before = rc.record("web")
    assert before is not None and before["phase"] == "Ready", before

    _private(node_file, f"TOKEN={value}\nPORT=9000\n")  # the running engine's file
    age_key.encrypt("CUDA_VISIBLE_DEVICES=0\n", rc.manifests / "secrets" / "gpu.env")
    rc.env["SOPS_AGE_KEY_FILE"] = str(age_key.file)
    fine = _private(rc.tmp / "node" / "fine.env", "MODE=fast\n")
    rc.write("fresh", envFrom=[{"file": str(fine)}, {"sopsFile": "secrets/gpu.env"}])
    port = f"spec.envFrom[0]: file {node_file} sets PORT: reconcile sets PORT to the port"
    gpu = (
        "spec.envFrom[1]: sopsFile secrets/gpu.env sets CUDA_VISIBLE_DEVICES: reconcile "
        "sets CUDA_VISIBLE_DEVICES from the devices it placed the engine on"
    )
    plan = rc("plan", check=1)
    planned = plan.out + plan.err
    assert port in planned and "spec.port" in planned, planned
    assert gpu in planned and "spec.devices" in planned, planned
    assert "command or args; remove it from that file" in planned, planned

    result = rc.once(check=1)
    said = result.out + result.err
    assert port in said and gpu in said and "Traceback" not in said, said
    status = rc.status(cli=True)
    assert status["fresh"]["phase"] == "Pending", status
    assert "sopsFile secrets/gpu.env sets CUDA_VISIBLE_DEVICES" in status["fresh"]["message"]
    assert not rc.pids("fresh")
    web = rc.record("web")
    assert web is not None and web["ref"] == before["ref"] and rc.alive(before["ref"]["pid"])
    assert web["spec_valid"] is False and f"file {node_file} sets PORT" in web["message"], web
    assert value not in said + planned + json.dumps(status)
    rc.down()


def test_a_key_from_a_sops_file_is_presented_and_never_written(
    reconcile: Any, age_key: AgeKey, tmp_path: Path
) -> None:
    """An engine's API key in a `sopsFile:` (VLLM_API_KEY, decrypted by the real sops)
    reaches its probes as a `file:`'s does: it gets Ready by a keyed `completion` and
    stays live through each pass (threshold 1: a refused probe would restart it), and the
    key is in no file of the state dir, nor in `describe -o json`, the events or a pass's
    output."""
    rc = reconcile
    age_key.encrypt(f"VLLM_API_KEY={KEY}\n", rc.manifests / "secrets" / "engine.env")
    rc.env["SOPS_AGE_KEY_FILE"] = str(age_key.file)
    live = {"completion": {}, "periodSeconds": 0.2, "timeoutSeconds": 10, "failureThreshold": 1}
    spec = {"envFrom": [{"sopsFile": "secrets/engine.env"}], "livenessProbe": live}
    _standin(rc, tmp_path, "sops", {**COMPLETION, "deadlineSeconds": 30}, **spec)
    rc.converge(timeout="60s")
    before = rc.status()["sops"]
    assert before["ready"] is True, before
    for _ in range(2):  # each pass probes liveness with the key it decrypted
        rc.once()
    after = rc.status()["sops"]
    assert after["ready"] is True and after["restarts"] == 0, after
    assert after["pid"] == before["pid"], after
    said = f"{_said(rc, 'sops')}\n{rc('describe', 'sops', '-o', 'json', check=0)}"
    assert "completion" in said and "sops" in said and KEY not in said
    _no_key_in(rc.state)
    rc.down()


def _keyed_answer(port: int) -> bool:
    """The engine answers a completion that presents its key (its server is up)."""
    ask = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=b'{"model": "tiny", "prompt": "hi", "max_tokens": 1}',
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(ask, timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.mark.parametrize("source", ["file", "sopsFile"])
def test_status_refresh_probes_with_the_key_from_envfrom(
    reconcile: Any, age_key: AgeKey, tmp_path: Path, source: str
) -> None:
    """`status --refresh` showed an engine whose API key comes from envFrom Starting while
    it was Ready: its probe had only the record, which holds no secret, and was refused
    (401). It presents the key the pass does, read from the record's manifest, and the
    key is in nothing it prints."""
    rc = reconcile
    if source == "file":
        spec_from: dict[str, str] = {
            "file": str(_private(tmp_path / "api.env", f"VLLM_API_KEY={KEY}\n"))
        }
    else:
        age_key.encrypt(f"VLLM_API_KEY={KEY}\n", rc.manifests / "secrets" / "api.env")
        rc.env["SOPS_AGE_KEY_FILE"] = str(age_key.file)
        spec_from = {"sopsFile": "secrets/api.env"}
    _standin(rc, tmp_path, "keyed", {**COMPLETION, "deadlineSeconds": 120}, envFrom=[spec_from])
    gate = tmp_path / "serve"  # the engine starts serving once this file is there
    wrapper = tmp_path / "gated-vllm"
    wrapper.write_text(
        f'#!/bin/sh\nwhile [ ! -e {gate} ]; do sleep 0.05; done\nexec {tmp_path / "vllm"} "$@"\n'
    )
    wrapper.chmod(0o755)
    manifest = rc.manifests / "keyed.yaml"
    manifest.write_text(manifest.read_text().replace(str(tmp_path / "vllm"), str(wrapper)))
    rc.once()
    record = rc.record("keyed")
    assert record is not None and record["phase"] == "Starting", record
    gate.touch()
    rc.wait_for(lambda: _keyed_answer(record["port"]), timeout=60, what="the engine serving")
    for shown in (
        rc("status", "--refresh", "-o", "json", check=0),
        rc("status", "--refresh", check=0),
    ):
        assert KEY not in shown.out + shown.err, shown
    (item,) = rc("status", "--refresh", "-o", "json", check=0).json()
    assert (item["phase"], item["ready"]) == ("Ready", True), item
    assert "status --refresh" in item["message"], item  # seen now, not yet recorded
    assert rc.record("keyed")["phase"] == "Starting"  # a look writes nothing
    if source == "sopsFile":  # a user without the age key: the record's key, as before
        blind = {"SOPS_AGE_KEY_FILE": str(tmp_path / "no.agekey")}
        shown = rc("status", "--refresh", "-o", "json", check=0, env=blind)
        assert shown.json()[0]["phase"] == "Starting" and shown.err == "", shown
    rc.down()


def test_plan_without_the_age_key_plans_sops_file_deployments_as_unchanged(
    reconcile: Any, age_key: AgeKey
) -> None:
    """A CI job (a laptop) has no node age key: `plan` showed every deployment with a
    sopsFile as spec invalid and exited 1, failing the shipped workflow on every pull
    request. It plans them as if their values were unchanged (they cannot be known there),
    says so once per file, and exits 0 in sync, 2 with a change; a pass without the key
    still starts no engine whose secrets it cannot read."""
    rc = reconcile
    value = _secret("api")
    age_key.encrypt(f"API_KEY={value}\n", rc.manifests / "secrets" / "api.env")
    rc.env["SOPS_AGE_KEY_FILE"] = str(age_key.file)
    rc.env["XDG_CONFIG_HOME"] = str(rc.tmp / "config")  # no keys.txt of the box's user
    item = {"sopsFile": "secrets/api.env"}
    rc.write("web", envFrom=[item])
    rc.write("chat", envFrom=[item])
    rc.converge()
    before = {name: rc.record(name) for name in ("web", "chat")}

    del rc.env["SOPS_AGE_KEY_FILE"]  # the CI job's environment
    plan = rc("plan", check=0)
    said = "sopsFile secrets/api.env (chat, web): its values were not read here"
    assert plan.out.count("sopsFile secrets/api.env") == 1 and said in plan.out, str(plan)
    assert "SOPS_AGE_KEY_FILE is unset" in plan.out and "In sync" in plan.out, str(plan)
    doc = rc("plan", "-o", "json", check=0).json()
    assert doc["in_sync"] and doc["errors"] == [] and len(doc["secrets_not_read"]) == 1, doc
    other = make_key(rc.tmp / "other-keys", "other")  # a laptop's key: no recipient
    rc.env["SOPS_AGE_KEY_FILE"] = str(other.file)
    laptop = rc("plan", check=0)
    assert f"SOPS_AGE_KEY_FILE={other.file} is not one of its recipients" in laptop.out, laptop
    del rc.env["SOPS_AGE_KEY_FILE"]

    rc.write("web", envFrom=[item], args=["--changed"])
    plan = rc("plan", check=2)
    assert plan.out.count("sopsFile secrets/api.env") == 1, str(plan)
    changed = [line for line in plan.out.splitlines() if " web " in line]
    assert changed and "spec.args" in changed[0] and "envFrom" not in changed[0], str(plan)
    assert any(" chat " in x and "unchanged" in x for x in plan.out.splitlines()), str(plan)

    rc.write("fresh", envFrom=[item])
    result = rc.once(check=1)  # a pass still refuses what it cannot read
    assert "spec.envFrom[0]: sopsFile secrets/api.env cannot be decrypted" in result.err
    assert not rc.pids("fresh") and rc.status(cli=True)["fresh"]["phase"] == "Pending"
    for name, rec in before.items():
        assert rc.record(name)["ref"] == rec["ref"] and rc.alive(rec["ref"]["pid"]), name
    shown = plan.out + plan.err + json.dumps(doc) + laptop.out + result.out + result.err
    assert value not in shown, shown
    rc.down()


def test_plan_without_the_age_key_shows_an_in_place_change_beside_a_config_file_in_place(
    reconcile: Any, age_key: AgeKey, tmp_path: Path
) -> None:
    """Without the age key, a deployment with a sopsFile AND a vLLM --config file whose
    only change was in place (readiness) was planned as replaced, its unread values named
    as changed: the planner held the hash without them against the record's. In place."""
    rc = reconcile
    value = _secret("api")
    age_key.encrypt(f"API_KEY={value}\n", rc.manifests / "secrets" / "api.env")
    rc.env["SOPS_AGE_KEY_FILE"] = str(age_key.file)
    rc.env["XDG_CONFIG_HOME"] = str(rc.tmp / "config")  # no keys.txt of the box's user
    flags = tmp_path / "flags.yaml"
    flags.write_text("max-model-len: 4096\n")
    spec = {"args": ["--config", str(flags)], "envFrom": [{"sopsFile": "secrets/api.env"}]}
    _standin(rc, tmp_path, "v", **spec)
    try:
        rc.converge()
        del rc.env["SOPS_AGE_KEY_FILE"]  # the CI job's environment
        assert "In sync" in rc("plan", check=0).out
        _standin(rc, tmp_path, "v", probe={"periodSeconds": 0.5}, **spec)
        plan = rc("plan", check=2)
        (line,) = [x for x in plan.out.splitlines() if " v " in x]
        assert line.split()[:3] == ["~", "v", "in-place"], str(plan)
        assert line.endswith("spec.readiness.periodSeconds changed"), str(plan)
        assert "1 to update in place, 0 to replace" in plan.out, str(plan)
        assert value not in plan.out + plan.err
    finally:
        rc.down()
