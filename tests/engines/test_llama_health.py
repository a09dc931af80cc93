"""Completion probes against the real llama.cpp server (marker: ``llama``).

An ``engine: llama-cpp`` deployment of the tiny random-weight GGUF whose readiness and
liveness are both ``completion: {}``: it comes up Ready by a real one-token-budget
completion (``POST /v1/completions``, the recipe's path), the chat path answers too,
and a stopped server (SIGSTOP: alive, answering nothing) is restarted by ``--once``
after ``failureThreshold`` passes. The binary is ``scripts/build-llama-server``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import urllib.request
from pathlib import Path

import pytest

from controller.core.manifest.specs import document_hash
from controller.core.state import ProbeConfig
from controller.gateway.accounting.enginemetrics import parse
from controller.host.probes import ProbeTarget, probe
from controller.store.instances.records import RecordStore

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # plain `pytest` puts only this folder on sys.path
    sys.path.insert(0, str(ROOT))

from tests.engines.test_llama_e2e import (  # noqa: E402, F401 (fixtures)
    Cli,
    free_port,
    llama_server,
    node,
    wait_gone,
)
from tests.fixtures.tiny_gguf import write_tiny_llama_gguf  # noqa: E402

pytestmark = pytest.mark.llama

MANIFEST = """\
apiVersion: reconcile/v1
kind: Deployment
metadata:
  name: {name}
spec:
  engine: llama-cpp
  model: {model}
  executable: {binary}
  args: ["--threads", "1", "--ctx-size", "256", "--parallel", "1"{args}]
  env: {env}
  devices:
    count: 0
  basePort: {base_port}
  readiness:
    completion: {{}}
    deadlineSeconds: 60
    periodSeconds: 1
  livenessProbe:
    completion: {{}}
    periodSeconds: 1
    timeoutSeconds: {timeout}
    failureThreshold: {threshold}
  stopGracePeriodSeconds: 2
"""


def manifest(name: str, model: Path, binary: Path, **fields: object) -> str:
    """The probed llama-server's manifest; ``fields`` change args (appended), env and the
    liveness probe's timeout and threshold."""
    given = {"args": "", "env": "{}", "timeout": 2, "threshold": 2, **fields}
    return MANIFEST.format(name=name, model=model, binary=binary, base_port=free_port(), **given)


def test_completion_probes_against_llama_server(
    llama_server: Path,  # noqa: F811
    node: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    model = write_tiny_llama_gguf(tmp_path / "models" / "tiny.gguf")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    text = manifest("probed", model, llama_server)
    (manifests / "probed.yaml").write_text(text)
    cli = Cli(manifests, tmp_path / "state", node)

    cli.converge()  # Ready only once a completion answered 200 with a choice
    item = cli.status()["probed"]
    assert item["phase"] == "Ready", item
    port, pid = item["port"], item["pid"]
    for path in ("/v1/completions", "/v1/chat/completions"):
        config = ProbeConfig(completion=path, model=str(model), timeout_seconds=30)
        result = probe(ProbeTarget("127.0.0.1", port, config))
        assert result.ready, result
        assert result.detail == f"POST {path} -> 200 with a choice"

    os.kill(pid, signal.SIGSTOP)
    try:
        cli.ok("-f", str(manifests), "--once")  # the first failure: counted
        assert cli.status()["probed"]["pid"] == pid
        cli.converge()  # the second in a row: restarted, Ready by a completion again
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    item = cli.status()["probed"]
    assert item["phase"] == "Ready" and item["pid"] != pid and item["restarts"] == 1, item
    cli.ok("down", "-f", str(manifests))


def test_the_recipe_turns_on_metrics_and_the_gateway_reads_them(
    llama_server: Path,  # noqa: F811
    node: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The llama-cpp recipe passes --metrics (the manifest's args do not): the real
    server's /metrics states its queue, as enginemetrics reads it."""
    model = write_tiny_llama_gguf(tmp_path / "models" / "tiny.gguf")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    text = manifest("probed", model, llama_server)
    (manifests / "probed.yaml").write_text(text)
    cli = Cli(manifests, tmp_path / "state", node)
    cli.converge()
    port = cli.status()["probed"]["port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        said = answer.read().decode()
    assert "llamacpp:requests_deferred" in said, said
    load = parse(said)
    assert load.waiting == 0.0, said  # idle: nothing deferred
    # llama.cpp dropped its KV cache series (the pinned build states none): its kvCache
    # then falls back to in flight; a build that states it is read as a ratio.
    if "llamacpp:kv_cache_usage_ratio" in said:
        assert load.kv_cache is not None and 0.0 <= load.kv_cache <= 1.0, said
    else:
        assert load.kv_cache is None, said
    cli.ok("down", "-f", str(manifests))


KEY = "sk-llama-probe-5d21"


def test_completion_probes_of_a_keyed_llama_server(
    llama_server: Path,  # noqa: F811
    node: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """llama-server given `--api-key` (or LLAMA_API_KEY) answers 401 to a completion
    without it: the probe sent none, and the engine was never Ready. The probes present
    the key; the engine gets Ready and stays live, and the key is shown nowhere."""
    model = write_tiny_llama_gguf(tmp_path / "models" / "tiny.gguf")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    keyed = {"timeout": 10, "threshold": 1}
    flag = manifest("flag", model, llama_server, args=f', "--api-key", "{KEY},other"', **keyed)
    env = manifest("env", model, llama_server, env=f"{{LLAMA_API_KEY: {KEY}}}", **keyed)
    (manifests / "flag.yaml").write_text(flag)
    (manifests / "env.yaml").write_text(env)
    cli = Cli(manifests, tmp_path / "state", node)

    cli.converge()  # Ready only once a keyed completion answered 200 with a choice
    before = cli.status()
    assert before["flag"]["phase"] == "Ready" and before["env"]["phase"] == "Ready", before
    passes = [cli.ok("-f", str(manifests), "--once") for _ in range(2)]  # liveness, each pass
    after = cli.status()
    for name in ("flag", "env"):
        assert after[name]["phase"] == "Ready", after[name]
        assert after[name]["pid"] == before[name]["pid"], after[name]  # not killed as unlive
    shown = [
        *passes,
        cli.ok("status", "-o", "json"),
        cli.ok("describe", "flag"),
        cli.ok("describe", "env"),
    ]
    assert KEY not in "\n".join(p.stdout + p.stderr for p in shown)
    cli.ok("down", "-f", str(manifests))


def test_completion_probes_of_a_llama_server_given_a_key_file(
    llama_server: Path,  # noqa: F811
    node: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """llama-server given `--api-key-file` (one key a line) answered 401 to every probe's
    completion: reconcile never read the file. The loader reads it and the probes present
    its first key; the engine gets Ready and stays live through each `--once` (a process
    of its own, which reads the file again), and the key is in no file of the state dir
    (the record keeps none), nor in `describe -o json`, the events or what a pass says."""
    model = write_tiny_llama_gguf(tmp_path / "models" / "tiny.gguf")
    keys = tmp_path / "keys"
    keys.write_text(f"\n{KEY}\nother\n")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    keyed = {"timeout": 10, "threshold": 1}
    args = f', "--api-key-file", "{keys}"'
    (manifests / "file.yaml").write_text(manifest("file", model, llama_server, args=args, **keyed))
    state = tmp_path / "state"
    cli = Cli(manifests, state, node)
    try:
        cli.converge()  # Ready only once a keyed completion answered 200 with a choice
        before = cli.status()["file"]
        assert before["phase"] == "Ready", before
        passes = [cli.ok("-f", str(manifests), "--once") for _ in range(2)]  # liveness
        after = cli.status()["file"]
        assert after["phase"] == "Ready" and after["pid"] == before["pid"], after
        shown = [*passes, cli.ok("status", "-o", "json"), cli.ok("describe", "file", "-o", "json")]
        assert KEY not in "\n".join(p.stdout + p.stderr for p in shown)
        held = [p for p in state.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
        assert not held, held  # records, events, logs, caches
        assert (state / "events" / "file.jsonl").is_file()  # the events were looked at
    finally:
        cli.ok("down", "-f", str(manifests))


def _as_before(state: Path, name: str) -> str:
    """The record as a release before wrote it, its hash covering no key file (a spec of
    args and env alone: the spec document's); the hash it held returned."""
    store = RecordStore(state)
    record = store.read(name)
    assert record is not None, name
    old = document_hash(record.stored_spec)
    assert old != record.spec_hash, "the record's hash covers the key file"
    store.write(dataclasses.replace(record, spec_hash=old))
    return record.spec_hash


def test_an_edited_key_file_restarts_the_engine_with_its_new_key(
    llama_server: Path,  # noqa: F811
    node: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """An edit of `--api-key-file` restarted nothing (its bytes joined no hash): the
    engine kept the key it read at its start, the probes presented the new one, were
    refused, and liveness restarted it as "not live". The file's digest joins the hash:
    an unchanged file restarts nothing, nor does an upgrade (a record hashed without it
    is given today's hash); an edit restarts the engine, Ready by a completion with the
    new key; neither key is in any output or file of the state dir."""
    new = "sk-llama-edited-0b7e"
    model = write_tiny_llama_gguf(tmp_path / "models" / "tiny.gguf")
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\n")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    args = f', "--api-key-file", "{keys}"'
    text = manifest("file", model, llama_server, args=args, timeout=10, threshold=1)
    (manifests / "file.yaml").write_text(text)
    state = tmp_path / "state"
    cli = Cli(manifests, state, node)
    try:
        cli.converge()
        before = cli.status()["file"]
        assert before["phase"] == "Ready", before
        shown = [cli.ok("-f", str(manifests), "--once")]  # the same file: nothing restarted
        keyed = _as_before(state, "file")
        shown.append(cli.ok("plan", "-f", str(manifests)))  # 0: in sync, foreseen re-keyed
        shown.append(cli.ok("-f", str(manifests), "--once"))  # an upgrade: nothing either
        kept = cli.status()["file"]
        assert kept["phase"] == "Ready" and kept["pid"] == before["pid"], kept
        assert RecordStore(state).read("file").spec_hash == keyed  # type: ignore[union-attr]

        keys.write_text(f"{new}\n")
        shown.append(cli.run("plan", "-f", str(manifests)))  # 2: changes to make
        assert shown[-1].returncode == 2, shown[-1]
        assert "file  replace    llama.cpp's --api-key-file changed" in shown[-1].stdout
        cli.converge()  # Ready only once a completion with the new key answered
        after = cli.status()["file"]
        assert after["phase"] == "Ready" and after["pid"] != before["pid"], after
        wait_gone(before["pid"])
        shown.append(cli.ok("-f", str(manifests), "--once"))  # liveness: the new key
        assert cli.status()["file"]["pid"] == after["pid"]
        shown += [cli.ok("status", "-o", "json"), cli.ok("describe", "file", "-o", "json")]
        shown.append(cli.ok("events", "file"))
        assert "--api-key-file" in json.dumps([p.stdout for p in shown])
        said = "\n".join(p.stdout + p.stderr for p in shown)
        files = [f for f in state.rglob("*") if f.is_file()]
        held = [f for f in files for k in (KEY, new) if k.encode() in f.read_bytes()]
        assert KEY not in said and new not in said and held == [], held
    finally:
        cli.ok("down", "-f", str(manifests))
