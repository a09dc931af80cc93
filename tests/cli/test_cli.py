"""The command's contract: exit codes, output shapes, options anywhere, usage errors.

Every call runs the real CLI in a subprocess (the ``reconcile`` fixture); none may
print a traceback (the fixture checks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.core.manifest.quantity import format_age
from controller.core.state import Record
from controller.gateway.lifecycle import registry
from controller.host.procs import identity

STATUS_FIELDS = {"name", "phase", "pid", "port", "devices", "restarts", "ready", "spec_valid",
                 "message"}  # fmt: skip


# -- --once ------------------------------------------------------------------------------


def test_once_exit_0_when_all_valid_and_placed(reconcile: Any) -> None:
    reconcile.write("web")
    result = reconcile.once()
    assert result.code == 0
    assert reconcile.status()["web"]["phase"] in ("Starting", "Ready")
    reconcile.down()


@pytest.mark.parametrize(
    "why",
    ["invalid-manifest", "pending-no-capacity", "failed-never"],
)
def test_once_exit_1(reconcile: Any, why: str) -> None:
    reconcile.write("good")
    if why == "invalid-manifest":
        reconcile.write_text("bad.yaml", "apiVersion: reconcile/v1\nkind: Deployment\nspec: [")
    elif why == "pending-no-capacity":
        reconcile.write("big", devices={"count": 5})
    else:
        reconcile.write("job", command=["/bin/false"], readiness=None, restartPolicy="Never")
    result = reconcile.once(check=None)
    if why == "failed-never" and result.code == 0:  # it may exit after the pass: look again
        reconcile.wait_for(lambda: not reconcile.pids("job"), what="the job to exit")
        result = reconcile.once(check=None)
    assert result.code == 1, str(result)
    assert reconcile.status()["good"]["phase"] in ("Starting", "Ready")  # the rest ran
    reconcile.down()


def _closed_pipe_run(rc: Any, *args: str, unbuffered: bool) -> int:
    """The CLI with stdout and stderr into a pipe whose reader has gone (`| true`)."""
    read, write = os.pipe()
    os.close(read)
    env = {k: v for k, v in rc.env.items() if k != "PYTHONUNBUFFERED"}
    env |= {"PYTHONUNBUFFERED": "1"} if unbuffered else {}
    try:
        argv = rc.argv(*args)
        done = subprocess.run(argv, stdout=write, stderr=write, env=env, cwd=rc.tmp, timeout=60)
    finally:
        os.close(write)
    return done.returncode


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "python-u"])
def test_a_reader_gone_changes_neither_the_pass_nor_its_exit_code(
    reconcile: Any, unbuffered: bool
) -> None:
    """`reconcile --once | head -1`: the first write after the reader went raised
    BrokenPipeError, which ended the pass where it stood and exited 0 (a failed pass read
    as a good one; with stderr in the pipe too, nothing after the first log line started),
    or, buffered, exited 120 at the last flush. The pass runs whole and its code stands;
    so does `plan`'s."""
    rc = reconcile
    rc.write("good")
    rc.write("elsewhere", nodeSelector={"gpu": "h100"}, basePort=rc.port + 2)  # stdout: a note
    rc.write_text("bad.yaml", "apiVersion: reconcile/v1\nkind: Deployment\nspec: [")
    assert _closed_pipe_run(rc, "plan", unbuffered=unbuffered) == 1  # as --once will
    assert _closed_pipe_run(rc, "--once", unbuffered=unbuffered) == 1
    assert rc.status()["good"]["phase"] in ("Starting", "Ready")  # the pass ran whole
    (rc.manifests / "bad.yaml").unlink()
    assert _closed_pipe_run(rc, "--once", unbuffered=unbuffered) == 0
    rc.down()


def test_wait_brings_up_what_it_can_beside_a_broken_manifest_then_names_it(
    reconcile: Any,
) -> None:
    # A new user's first try: one good engine that takes a moment to load, one typo'd file.
    # --wait must not give up while the good one is still Starting: it waits it out to
    # Ready, then exits 1 naming the broken file (not by running out of time).
    rc = reconcile
    rc.write("web", command=rc.demo_command(load_seconds="1.5"))
    rc.write_text("broken.yaml", "apiVersion: reconcile/v1\nkind: Deployment\nspec: [")
    result = rc("--once", "--wait", "--timeout", "60s", check=1)
    assert "broken.yaml" in result.err, str(result)
    assert "timed out" not in result.err, str(result)
    web = rc.status("web", cli=True)["web"]
    assert web["phase"] == "Ready" and web["ready"] is True, web
    (rc.manifests / "broken.yaml").unlink()
    rc.down()


def test_wait_counts_an_idle_on_demand_deployment_as_settled(reconcile: Any) -> None:
    # Idle until a request is where an OnDemand deployment belongs: beside a broken file
    # the wait ends at once naming the file, not when --timeout runs out.
    rc = reconcile
    rc.write("lazy", activation="OnDemand")
    rc.write_text("broken.yaml", "apiVersion: reconcile/v1\nkind: Deployment\nspec: [")
    result = rc("--once", "--wait", "--timeout", "45s", check=1)
    assert "broken.yaml" in result.err and "timed out" not in result.err, str(result)
    assert rc.status("lazy", cli=True)["lazy"]["phase"] == "Idle"
    (rc.manifests / "broken.yaml").unlink()
    rc.down()


def test_once_is_ready_in_the_same_pass_when_the_engine_is_quick(reconcile: Any) -> None:
    reconcile.write("web")
    reconcile.converge()
    assert reconcile.status()["web"]["ready"] is True
    reconcile.down()


# -- plan ----------------------------------------------------------------------------------


def test_plan_exit_codes_2_then_0_and_changes_nothing(reconcile: Any) -> None:
    reconcile.write("web")
    pending = reconcile("plan", check=2)
    assert "web" in pending.out and "start" in pending.out
    assert not (reconcile.state / "instances").exists() or reconcile.status() == {}
    assert reconcile.pids() == set()

    as_json = reconcile("plan", "-o", "json", check=2).json()
    (change,) = as_json["changes"]
    assert change["name"] == "web" and change["action"] == "start"
    assert change["change"] == "create" and "new deployment" in change["reason"]
    assert as_json["errors"] == []

    reconcile.converge()
    in_sync = reconcile("plan", check=0)
    assert "in sync" in in_sync.out.lower()
    reconcile.down()


def test_plan_exit_1_on_invalid_input(reconcile: Any) -> None:
    reconcile.write_text("bad.yaml", "apiVersion: reconcile/v1\nkind: Deployment\nspec: [")
    result = reconcile("plan", check=1)
    assert f"{reconcile.manifests / 'bad.yaml'}:4: invalid YAML" in result.err + result.out


def test_dry_run_is_plan(reconcile: Any) -> None:
    reconcile.write("web")
    reconcile("--dry-run", check=2)
    assert reconcile.pids() == set()


# -- status ----------------------------------------------------------------------------------


def test_status_json_fields(reconcile: Any) -> None:
    reconcile.write("web", devices={"count": 1})
    reconcile.converge()
    (item,) = reconcile("status", "-o", "json", check=0).json()
    assert set(item) >= STATUS_FIELDS
    assert item["name"] == "web" and item["phase"] == "Ready" and item["ready"] is True
    assert isinstance(item["pid"], int) and item["pid"] in reconcile.pids("web")
    assert isinstance(item["port"], int) and item["devices"] == ["nvidia:0"]
    assert item["restarts"] == 0 and item["spec_valid"] is True and item["message"] == ""
    assert reconcile("get", "web", "-o", "json", check=0).json() == [item]  # alias, by name
    yaml_out = reconcile("status", "-o", "yaml", check=0).out
    assert "name: web" in yaml_out
    table = reconcile("status", check=0).out
    assert table.splitlines()[0].split()[:2] == ["NAME", "ENGINE"] and "web" in table
    reconcile.down()


def test_status_needs_no_manifests(reconcile: Any) -> None:
    reconcile.write("web")
    reconcile.converge()
    (item,) = reconcile(
        "status", "-o", "json", "-f", str(reconcile.tmp / "nowhere"), check=0
    ).json()
    assert item["name"] == "web"
    reconcile.down()


def test_status_of_an_unknown_name(reconcile: Any) -> None:
    result = reconcile("status", "nope", check=1)
    assert "no deployment named 'nope'" in result.err


def test_a_mistyped_name_gets_a_did_you_mean_on_every_verb(reconcile: Any) -> None:
    """Only `restart` offered one (issue 34, item 23); `logs web wbe` showed web and said
    nothing of wbe. A name with no near one lists the names there are."""
    reconcile.write("web")
    reconcile.once()
    for verb in (["status"], ["describe"], ["events"], ["logs"], ["logs", "web"]):
        err = reconcile(*verb, "wbe", check=1).err
        assert "no deployment named 'wbe'" in err and "did you mean 'web'?" in err, (verb, err)
    far = reconcile("status", "zzzzz", check=1).err
    assert "no deployment named 'zzzzz'" in far and "(known: web)" in far, far
    reconcile.down()


def test_status_get_and_describe_take_several_names(reconcile: Any) -> None:
    """`status a b` was a usage error (exit 64), while kubectl's get and describe take
    several names: each is shown in the order given, a NAME matching none is said as
    `no such` says it and exits 1, the others still shown."""
    reconcile.write("web")
    reconcile.write("api")
    reconcile.once()
    for verb in ("status", "get"):
        rows = reconcile(verb, "web", "api", check=0).out.splitlines()
        assert [r.split()[0] for r in rows[1:]] == ["web", "api"], rows
        named = reconcile(verb, "web", "api", "-o", "name", check=0).out.split()
        assert named == ["web", "api"], named
        items = reconcile(verb, "web", "api", "-o", "json", check=0).json()
        assert [i["name"] for i in items] == ["web", "api"], items
        half = reconcile(verb, "api", "wbe", check=1)
        assert [r.split()[0] for r in half.out.splitlines()[1:]] == ["api"], half.out
        assert "no deployment named 'wbe'" in half.err and "did you mean 'web'?" in half.err
    both = reconcile("describe", "web", "api", check=0).out.splitlines()
    assert [line.split()[1] for line in both if line.startswith("Name:")] == ["web", "api"]
    docs = reconcile("describe", "api", "web", "-o", "json", check=0).json()
    assert [d["name"] for d in docs] == ["api", "web"], docs
    half = reconcile("describe", "zzzzz", "web", check=1)
    assert [line.split()[1] for line in half.out.splitlines() if line.startswith("Name:")] == [
        "web"
    ], half.out
    assert "no deployment named 'zzzzz'" in half.err and "(known: api, web)" in half.err
    reconcile.down()


def test_kubectl_s_type_slash_name_gets_the_name_meant(reconcile: Any) -> None:
    """kubectl's `get deployment/web` said only "no deployment named 'deployment/web'
    (known: web)"; it names the one meant and why."""
    reconcile.write("web")
    reconcile.once()
    for verb in (["get"], ["describe"], ["events"], ["logs"]):
        err = reconcile(*verb, "deployment/web", check=1).err
        assert "did you mean 'web'? (NAME alone: no kubectl TYPE/ before it)" in err, (verb, err)
    reconcile.down()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["get", "pods"], "'pods' is a kubectl resource type: `reconcile status` with no NAME"),
        (["get", "nodes"], "'nodes' is a kubectl resource type: `reconcile devices` shows"),
        (["describe", "deploy"], "'deploy' is a kubectl resource type: `reconcile status`"),
    ],
    ids=["get-pods", "get-nodes", "describe-deploy"],
)
def test_a_kubectl_resource_type_as_the_name_says_what_lists_them(
    reconcile: Any, args: list[str], said: str
) -> None:
    """`get pods` beside a deployment named prod got "did you mean 'prod'?": kubectl's
    resource types are said for what they are, with the verb that lists."""
    reconcile.write("prod")
    reconcile.once()
    err = reconcile(*args, check=1).err
    assert said in err and "did you mean" not in err, err
    reconcile.down()


def test_status_of_nothing(reconcile: Any) -> None:
    assert reconcile("status", "-o", "json", check=0).json() == []


# -- validate, schema, down ----------------------------------------------------------------


def test_validate(reconcile: Any) -> None:
    reconcile.write("web")
    assert "1 deployment(s) in 1 file(s): valid" in reconcile("validate", check=0).out
    reconcile.write_text("bad.yaml", reconcile.dump_yaml(reconcile.deployment("x", replica=2)))
    result = reconcile("validate", check=1)
    assert f"{reconcile.manifests / 'bad.yaml'}:" in result.err
    assert "spec.replica: unknown field" in result.err
    assert reconcile.pids() == set() and not (reconcile.state / "instances").exists()


def test_validate_warns_of_a_secret_in_the_clear_and_a_variable_never_expanded(
    reconcile: Any,
) -> None:
    """Valid, but surely not meant: a token in the manifest (DESIGN: a repository of
    manifests holds no secret in the clear) and `${VAR}` (compose's, llama-swap's habit),
    which the engine got as text. Each said on its line with the move, exit 0, and the
    token never echoed; a setting whose name says TOKEN, a path, a word are left be."""
    env = {
        "HF_TOKEN": "hf_Secret0123456789",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_TOKEN_PATH": "/data/token",
        "HOME_DIR": "${HOME}/models",
        "MODE": "fast",
    }
    path = reconcile.write("web", env=env, args=["--api-base", "$BASE"])
    result = reconcile("validate", check=0)
    assert "1 deployment(s) in 1 file(s): valid" in result.out
    warnings = [line for line in result.err.splitlines() if line.startswith("warning: ")]
    lines = path.read_text().splitlines()
    at = {key: lines.index(next(ln for ln in lines if key in ln)) + 1 for key in env}
    args_at = lines.index(next(ln for ln in lines if "$BASE" in ln)) + 1
    assert warnings == [
        f"warning: {path}:{at['HF_TOKEN']}: spec.env.HF_TOKEN: a secret's value written in the "
        "manifest, in the clear wherever it is kept: move it to a file spec.envFrom reads "
        "({file: /etc/reconcile/NAME.env}, 0600, or {sopsFile: ...})",
        f"warning: {path}:{at['HOME_DIR']}: spec.env.HOME_DIR: ${{HOME}} is not expanded (no "
        "shell runs the engine): it gets the text as written; a value of the node's: a file "
        "spec.envFrom reads; else write the value out",
        f"warning: {path}:{args_at}: spec.args[1]: $BASE is not expanded (no shell runs the "
        "engine): it gets the text as written; a value of the node's: a file spec.envFrom "
        "reads; else write the value out",
    ], result.err
    assert "Secret0123456789" not in result.out + result.err


def test_schema_is_json_schema(reconcile: Any) -> None:
    schema = reconcile("schema", check=0).json()
    assert schema["title"] == "reconcile Deployment"
    assert "spec" in schema["properties"]


def test_down_stops_everything_of_this_set(reconcile: Any) -> None:
    reconcile.write("a")
    reconcile.write("b", devices={"count": 1})
    reconcile.converge()
    pids = reconcile.pids()
    assert len(pids) == 2
    result = reconcile.down()
    lines = sorted(line for line in result.out.splitlines() if line)
    assert lines == ["stopped a", "stopped b"], "stdout is for results; logs go to stderr"
    for pid in pids:
        assert not reconcile.alive(pid)
    assert reconcile.status() == {}
    assert reconcile.down().out.strip() == ""  # again: nothing to do, still exit 0


# -- records the CLI cannot use -------------------------------------------------------------


def test_a_corrupt_record_is_quarantined_with_a_reason(reconcile: Any) -> None:
    reconcile.write("web")
    reconcile.store()
    reconcile.record_path("web").write_text('{"version": 1, "name": "web", "ow')
    result = reconcile.once(check=1)  # cron hears about it
    assert "record moved to" in result.err and "not valid JSON" in result.err
    quarantined = list((reconcile.state / "quarantine").iterdir())
    reason = next(p for p in quarantined if p.name.endswith(".reason"))
    assert "not valid JSON" in reason.read_text()
    assert reconcile.status()["web"]["phase"] in ("Starting", "Ready")  # a fresh record
    reconcile.down()


TORN = '{"version": 1, "name": "web", "ow'
READ_VERBS = [
    ("status",),
    ("status", "web"),
    ("status", "-o", "json"),
    ("status", "--refresh"),
    ("describe", "web"),
    ("devices",),
    ("devices", "-o", "json"),
    ("plan",),
    ("source",),
]


def test_read_verbs_name_a_torn_record_and_move_nothing(reconcile: Any) -> None:
    """kubectl get never mutates: `status` once quarantined a torn record (exit 0). Each
    read verb names the file, what is wrong and the next move, exits 1 (what it shows is
    not whole, as `plan` says of an unreadable record) and leaves the state dir as it was;
    only the pass sets the record aside."""
    reconcile.write("web", devices={"count": 1})
    reconcile.converge()
    path = reconcile.record_path("web")
    path.write_text(TORN)
    # What status, describe, devices and plan read beside the records: torn too.
    sides = ["observed.json", "devices/health.json", "devices/measured.json"]
    sides += ["activation/web.json", "restart/web.json", "scale/web.json"]
    for side in sides:
        (reconcile.state / side).parent.mkdir(exist_ok=True)
        (reconcile.state / side).write_text("{")
    before = _tree(reconcile.state)
    for verb in READ_VERBS:
        result = reconcile(*verb)
        if verb == ("source",):  # no git source: it reads no record
            continue
        said = result.err + result.out  # plan lists its errors with the plan
        assert result.code == 1, str(result)
        assert f"record {path} cannot be read (not valid JSON" in said, str(result)
        assert "the next pass (`reconcile --once`, or the daemon's) moves it" in said
        assert _tree(reconcile.state) == before, f"reconcile {' '.join(verb)} changed it"
    assert path.read_text() == TORN
    assert "record moved to" in reconcile.once(check=1).err  # the pass sets it aside
    assert [p.name for p in (reconcile.state / "quarantine").glob("web.json.*.reason")]
    assert reconcile.status()["web"]["phase"] == "Ready"  # its engine adopted
    assert reconcile("status", check=0).err == ""
    reconcile.down()


def _tree(state: Path) -> dict[str, bytes]:
    """Every file under the state dir but logs and journals (a read verb writes neither)."""
    return {
        str(p.relative_to(state)): p.read_bytes()
        for p in sorted(state.rglob("*"))
        if p.is_file() and p.suffix not in (".log", ".jsonl")
    }


def test_an_unknown_record_version_says_how_to_recover(reconcile: Any) -> None:
    reconcile.devices = "nvidia:0,nvidia:1"
    reconcile.store()
    future = {"version": 7, "name": "old", "devices": ["nvidia:0"], "port": reconcile.port,
              "nonce": "n-old"}  # fmt: skip
    reconcile.record_path("old").write_text(json.dumps(future))
    its_engine = reconcile.spawn(  # the engine that newer reconcile runs: not ours to reap
        [sys.executable, "-c", "import time; time.sleep(300)"],
        env={**reconcile.env, "RECONCILE_INSTANCE": f"{reconcile.node}/old/n-old",
             "RECONCILE_STATE": str(reconcile.state.resolve())},
    )  # fmt: skip
    reconcile.wait_for(lambda: reconcile.pids("old"), what="the newer engine's marker")
    reconcile.write("web", devices={"count": 1})
    result = reconcile.once(check=1)
    hint = "understands versions 1, 2, 3, 4. Run the reconcile that wrote it, or stop its engine"
    assert "has version 7" in result.err and hint in result.err
    web = reconcile.status()["web"]
    assert web["devices"] == ["nvidia:1"]  # what the unreadable record holds stays held
    assert web["port"] != reconcile.port
    assert json.loads(reconcile.record_path("old").read_text()) == future  # never reset
    assert "has version 7" in reconcile("status", check=1).err  # not all of it is shown
    assert reconcile("plan", check=1).code == 1
    reconcile.down()
    assert its_engine.poll() is None  # neither a pass nor down touched it
    its_engine.kill()
    its_engine.wait()
    reconcile.record_path("old").unlink()


def test_devices_shows_what_a_record_of_an_unknown_version_holds(reconcile: Any) -> None:
    """`devices` once showed the device and port of a record of an unknown version free,
    while every pass counts them held (its engine holds them): it names the holder now."""
    reconcile.devices = "nvidia:0,nvidia:1"
    reconcile.store()
    future = {"version": 7, "name": "old", "devices": ["nvidia:0"], "port": reconcile.port}
    reconcile.record_path("old").write_text(json.dumps(future))
    doc = reconcile("devices", "-o", "json", check=1).json()  # 1: the table is not whole
    holder = "old (unreadable record)"
    assert {d["device"]: d["held_by"] for d in doc["devices"]} == {
        "nvidia:0": [holder],
        "nvidia:1": [],
    }, doc
    assert doc["ports"] == [{"port": reconcile.port, "held_by": holder, "phase": "Unknown"}]
    shown = reconcile("devices", check=1)
    assert holder in shown.out and "has version 7" in shown.err, shown
    reconcile.write("web", devices={"count": 1})
    reconcile.once(check=1)  # what the pass counts held, as `devices` said
    assert reconcile.status()["web"]["devices"] == ["nvidia:1"]
    reconcile.down()
    reconcile.record_path("old").unlink()


def test_a_spec_the_recipe_refuses_at_placement_is_pending_not_a_crash(reconcile: Any) -> None:
    """TGI's socket path depends on the state dir: only the pass can see it is too long."""
    reconcile.state = reconcile.tmp / ("s" * 100)
    reconcile.write("tgi", engine="tgi", model="m", command=None, readiness=None)
    reconcile.write("web", basePort=reconcile.port + 5)
    result = reconcile.once(check=1)
    status = reconcile.status()
    assert (
        status["tgi"]["phase"] == "Pending"
        and "use a shorter --state-dir" in (status["tgi"]["message"])
    )
    assert status["tgi"]["port"] is None and status["tgi"]["devices"] == []
    assert status["web"]["phase"] in ("Starting", "Ready")  # the rest of the pass went on
    assert "tgi: Pending: TGI's shard socket path" in result.err
    reconcile.down()


# -- arguments ------------------------------------------------------------------------------


def test_options_before_or_after_the_verb(reconcile: Any) -> None:
    reconcile.write("web")
    reconcile.once()
    reconcile.wait_for(lambda: reconcile.status()["web"]["pid"], what="the engine")
    common = ["--state-dir", str(reconcile.state), "--node", reconcile.node,
              "--devices", reconcile.devices, "-f", str(reconcile.manifests)]  # fmt: skip
    after = reconcile("status", "-o", "json", *common, common=False, check=0).json()
    before = reconcile(*common, "-o", "json", "status", common=False, check=0).json()
    mixed = reconcile(*common[:2], "status", *common[2:], "-o", "json", common=False, check=0)
    assert after == before == mixed.json() and after[0]["name"] == "web"
    for args in (["plan", *common], [*common, "plan"]):  # its answer may change: not compared
        assert reconcile(*args, "-o", "json", common=False).code in (0, 2)
    reconcile.down()


def test_environment_configures_the_node(reconcile: Any) -> None:
    reconcile.write("web")
    env = {
        "RECONCILE_STATE_DIR": str(reconcile.state),
        "RECONCILE_NODE": reconcile.node,
        "RECONCILE_DEVICES": reconcile.devices,
        "RECONCILE_MANIFESTS": str(reconcile.manifests),
    }
    reconcile("--once", common=False, env=env, check=0)
    assert reconcile.status()["web"]["node"] == reconcile.node
    reconcile.down()


@pytest.mark.parametrize(
    "args",
    [
        ["frobnicate"],
        ["--no-such-option"],
        ["events", "a", "b"],  # kubectl events --for takes one
        ["describe"],
        ["logs", "--tail", "many"],  # `logs` alone is every deployment's (issue 25)
        ["--wait"],
        ["status", "-o", "xml"],
        ["--once", "--resync", "5x"],
        ["--once", "--wait", "--timeout", "forever"],
        ["drain", "--ttl", "soon"],
    ],
    ids=lambda a: " ".join(a),
)
def test_usage_errors_exit_64(reconcile: Any, args: list[str]) -> None:
    result = reconcile(*args, check=64)
    assert result.err.strip()


def test_a_bad_duration_is_not_a_traceback(reconcile: Any) -> None:
    result = reconcile("--once", "--lock-timeout", "soon", check=64)
    assert "--lock-timeout" in result.err and "soon" in result.err


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--once", "--max-instances", "x=y"], {}, "--max-instances"),
        (["status", "--max-instances", "nvidia=-1"], {}, "--max-instances"),
        (["status"], {"RECONCILE_MAX_INSTANCES": "x=y"}, "RECONCILE_MAX_INSTANCES"),
        (["status", "--node", "a/b"], {}, "--node"),
        (["status"], {"RECONCILE_NODE": "a/b"}, "RECONCILE_NODE"),
        (["logs", "--tail", "-5"], {}, "--tail"),
    ],
    ids=["max-instances", "max-instances-verb", "max-instances-env", "node", "node-env", "tail"],
)
def test_a_bad_flag_or_its_variable_is_a_usage_error(
    reconcile: Any, args: list[str], env: dict[str, str], named: str
) -> None:
    """`--max-instances x=y` exited 1, where README says 64 is always a usage error (issue 34,
    item 18): each is checked by the parser, as is the variable that stands in for it."""
    state = ["--state-dir", str(reconcile.state), "-f", str(reconcile.manifests)]
    result = reconcile(*args, *state, common=False, env=env, check=64)
    assert named in result.err and len(result.err.strip().splitlines()) == 1, result.err


def test_record_model_has_the_documented_fields() -> None:
    documented = {"version", "name", "owner", "source", "spec_hash", "node", "engine", "nonce",
                  "ref", "reserved_by", "port", "devices", "phase", "reserved_at", "started_at",
                  "ready_deadline_at", "ready_at", "restarts", "backoff_until", "last_exit",
                  "message"}  # fmt: skip
    assert documented <= {f.name for f in dataclasses.fields(Record)}


def test_every_verb_has_a_handler_and_every_handler_a_verb() -> None:
    import argparse

    from controller.cli.main import build_parser
    from controller.cli.verbs import VERBS, handler

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) | {"run"} == set(VERBS)
    assert all(callable(handler(verb)) for verb in VERBS)


def test_a_call_builds_whole_only_the_verbs_it_names() -> None:
    """Every call built every verb's flags (~5 ms of its CPU, most of a `status`'s). The
    verbs a call names are built whole, each as the whole parser has it; the others keep
    their name and help, so the usage reads as before; the completion script's parser
    is the whole one."""
    import argparse

    from controller.cli.main import build_parser

    def verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return dict(sub.choices)

    def flags(parser: argparse.ArgumentParser) -> set[str]:
        return set(parser._option_string_actions)

    whole = verbs(build_parser())
    for name, verb in whole.items():
        called = build_parser([name, "--bogus"])
        assert flags(verbs(called)[name]) == flags(verb), name
        assert called.format_help() == build_parser().format_help()
    plain = verbs(build_parser(["status", "web"]))
    assert "--state-dir" in flags(plain["status"]) and "--state-dir" not in flags(plain["plan"])
    completion = verbs(build_parser(["completion", "bash"]))
    assert all(flags(completion[name]) == flags(verb) for name, verb in whole.items())


def test_the_ray_backend_without_ray_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A machine without the `ray` extra gets the next move, not an ImportError."""
    import importlib.util

    from controller.cli.main import main

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    argv = ["--once", "--backend", "ray", "--ray-address", "127.0.0.1:1", "-f", str(tmp_path)]
    code = main([*argv, "--state-dir", str(tmp_path / "s"), "-q"])
    err = capsys.readouterr().err
    assert code == 1 and "pip install 'reconcile-engines[ray]'" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err  # one line
    assert not (tmp_path / "s" / "instances").exists() or not any(
        (tmp_path / "s" / "instances").glob("*.json")
    )


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--once", "--wait", "--timeout", "0"), "--timeout"),
        (("--once", "--wait", "--timeout", "-5"), "--timeout"),
        (("--resync", "0s"), "--resync"),
        (("drain", "--ttl", "0"), "--ttl"),
        (("--once", "--lock-timeout", "-1"), "--lock-timeout"),
    ],
    ids=["timeout-0", "timeout-negative", "resync-0", "ttl-0", "lock-negative"],
)
def test_durations_that_cannot_mean_anything_are_usage_errors(
    reconcile: Any, flags: tuple[str, ...], named: str
) -> None:
    """Parsed once, by the parser: `drain --ttl 0` was accepted (a drain that ends as it
    begins) and a zero `--timeout` waited no time at all."""
    result = reconcile(*flags, check=64)
    assert named in result.err and "Traceback" not in result.err, result.err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("drain", "--ttl", "-5m"), "argument --ttl: '-5m' is negative"),
        (("--once", "--wait", "--timeout", "-1h30m"), "argument --timeout: '-1h30m' is negative"),
        (("--resync", "-5s"), "argument --resync: '-5s' is negative"),
        (("drain", "--ttl=-5m"), "argument --ttl: '-5m' is negative"),
        (("logs", "--tail", "-5x"), "argument --tail: '-5x' is not a whole number"),
    ],
    ids=["ttl", "timeout", "resync", "ttl-glued", "tail"],
)
def test_a_negative_duration_is_said_to_be_negative(
    reconcile: Any, flags: tuple[str, ...], said: str
) -> None:
    """argparse took `-5m` for a flag: `drain --ttl -5m` said `argument --ttl: expected one
    argument`, as if nothing had been given, and `--ttl=-5m` that it is not a duration.
    One line saying what is wrong with the value, exit 64."""
    result = reconcile(*flags, check=64)
    assert said in result.err and len(result.err.strip().splitlines()) == 1, result.err


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-3, "0s"),  # a clock step back: never a negative age
        (59, "59s"),
        (60, "60s"),  # seconds up to two minutes, as kubectl
        (119, "119s"),
        (120, "2m"),
        (3599, "59m"),
        (3600, "1h"),
        (7199, "1h59m"),  # floored: not rounded up to "120m" or "2h"
        (36000, "10h"),  # from ten hours on, whole hours
        (86399, "23h"),
        (2 * 86400, "2d"),
    ],
)
def test_ages_read_as_kubectl_get_shows_them(seconds: float, shown: str) -> None:
    assert format_age(seconds) == shown


@contextlib.contextmanager
def _registered_gateway(reconcile: Any, **fields: Any) -> Iterator[registry.GatewayInfo]:
    """A process the test starts, registered as a gateway of the state dir (the verbs only
    read the registry); killed at the end."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        ref = identity(holder.pid)
        assert ref is not None
        registry.ensure(reconcile.state)
        info = registry.GatewayInfo(ref=ref, host="127.0.0.1", port=reconcile.port, **fields)
        registry.register(reconcile.state, info)
        yield info
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_gateway_status_shows_ages_as_every_other_verb(reconcile: Any) -> None:
    """`gateway status` had its own formatter: a gateway up 1h59m showed "119m" (and at
    7,199 s "120m") while `status` said "1h59m"."""
    with _registered_gateway(
        reconcile,
        nonce="a1b2c3d4",
        version="test",
        fingerprint="test",
        settings={},
        started_at=time.time() - 7150,  # 1h59m10s: far from both edges
    ) as info:
        result = reconcile("gateway", "status", check=0)
        pid = str(info.ref.pid)
        row = next(line for line in result.out.splitlines() if line.startswith(pid))
        assert row.split()[3] == "1h59m", result.out


def test_gateway_restart_of_settings_another_version_wrote_is_an_error(reconcile: Any) -> None:
    """A gateway of another reconcile (a downgrade) whose settings this one cannot read:
    `gateway restart` ended in a traceback (KeyError 'state_dir'); it says so and what
    to do, and leaves that gateway alone."""
    with _registered_gateway(
        reconcile,
        nonce="e5f6a7b8",
        version="9.0.0",
        fingerprint="future",
        settings={"listen_on": ["127.0.0.1", reconcile.port]},
        started_at=time.time(),
    ) as info:
        registry.make_current(reconcile.state, info)
        result = reconcile("gateway", "restart", check=1)
        assert f"gateway pid {info.ref.pid} (reconcile 9.0.0) are not this" in result.err, result
        assert "restart the daemon with --listen" in result.err
        assert info.alive()


@pytest.mark.parametrize(
    "flags",
    [
        ("--once", "--tls-cert", "/etc/reconcile/cert.pem", "--tls-key", "/etc/reconcile/key.pem"),
        ("--once", "--api-keys", "/etc/reconcile/keys"),
        ("--once", "--max-inflight", "0"),
        ("--once", "--insecure-listen"),
    ],
    ids=lambda f: " ".join(f[1:2]),
)
def test_the_gateways_flags_without_listen_are_usage_errors(
    reconcile: Any, flags: tuple[str, ...]
) -> None:
    """They would do nothing: a certificate given for a gateway that never starts was
    taken without a word. Nothing runs: no pass, no record."""
    result = reconcile(*flags, check=64)
    named = [f for f in flags[1:] if f.startswith("--")]
    assert all(f in result.err for f in named) and "--listen" in result.err, result.err
    assert reconcile.record("demo") is None and not list(reconcile.state.glob("instances/*.json"))


def test_describe_shows_the_rest_when_the_log_cannot_be_read(reconcile: Any) -> None:
    """A folder in the place of `instances/logs/web.log` made `describe` fail whole with
    `I/O error`: its spec, record and events are still worth showing."""
    reconcile.write("web")
    reconcile.converge()
    log = reconcile.state / "instances" / "logs" / "web.log"
    log.rename(reconcile.tmp / "web.log")  # the engine writes on there, by its descriptor
    log.mkdir()
    out = reconcile("describe", "web", check=0)
    assert "Name:" in out.out and f"<not read: {log}: Is a directory>" in out.out, out
    log.rmdir()
    reconcile.down()
