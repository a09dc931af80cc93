"""kubectl/systemctl habits: -o only where it means something, -o name, -l selectors,
logs -f, examples and exit codes in every --help, a busy --metrics-port said plainly.
"""

from __future__ import annotations

import argparse
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.cli.main import build_parser
from controller.store.lock import FileLock

REPO = Path(__file__).resolve().parents[2]
TYPES = {"string": str, "bool": bool, "int": int, "null": type(None), "object": dict, "list": list}


@pytest.mark.parametrize(
    "args",
    [
        ["validate", "-o", "json"],
        ["schema", "-o", "yaml"],
        ["drain", "-o", "json"],
        ["--once", "-o", "json"],
        ["-o", "json", "down"],
    ],
    ids=["validate", "schema", "drain", "once", "before-down"],
)
def test_output_where_it_means_nothing_is_a_usage_error(reconcile: Any, args: list[str]) -> None:
    result = reconcile(*args, check=64)
    assert "-o/--output means nothing" in result.err
    assert "status, get, devices, plan" in result.err and "logs --requests" in result.err
    # --help's list is the same one (it said "status, get, devices, plan only")
    helped = " ".join(reconcile("--help", check=0).out.split())
    assert "output format (status, get, devices, plan, export, events, describe, source" in helped


def test_every_verb_has_examples_and_exit_codes() -> None:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in [("reconcile", parser), *subs.choices.items()]:
        text = sub.format_help()
        assert "examples:\n  reconcile" in text, name
        assert "exit codes:\n  0 " in text and "64  bad flags" in text, name


def test_labels_select_status_describe_plan_and_down(reconcile: Any) -> None:
    rc = reconcile
    _write_labelled(rc, "web", {"team": "search", "tier": "prod"})
    _write_labelled(rc, "db", {"team": "infra"})
    rc.converge()
    assert rc("status", "-l", "team=search", "-o", "name", check=0).out == "web\n"
    assert rc("status", "-l", "team=search", "-l", "tier=dev", "-o", "name", check=0).out == ""
    assert rc("get", "-o", "name", check=0).out == "db\nweb\n"
    items = {i["name"]: i for i in rc("status", "-o", "json", check=0).json()}
    assert items["web"]["labels"] == {"team": "search", "tier": "prod"}
    described = rc("describe", "-l", "team=infra", check=0).out
    assert described.startswith("Name:") and "db" in described and "web" not in described.split()
    assert rc("describe", "-l", "team=none", check=1).err.startswith("reconcile: no deployment")
    assert rc("describe", check=64).code == 64
    # `-l key`: the label exists (kubectl's habit); `-l =x` is one line of usage error
    assert rc("status", "-l", "tier", "-o", "name", check=0).out == "web\n"
    assert rc("get", "-l", "team", "-o", "name", check=0).out == "db\nweb\n"
    bad = rc("status", "-l", "=x", check=64).err
    assert bad.count("'=x': no key before '='") == 1 and len(bad.splitlines()) == 1, bad
    # kubectl's selectors: a comma is "and", `!=` holds where the label is absent, sets
    assert rc("get", "-l", "team=search,tier=prod", "-o", "name", check=0).out == "web\n"
    assert rc("get", "-l", "tier!=prod", "-o", "name", check=0).out == "db\n"
    assert rc("get", "-l", "team in (infra,ml),!tier", "-o", "name", check=0).out == "db\n"

    # A label change is no spec change: the record follows, the engine keeps running.
    pid = rc.record("db")["ref"]["pid"]
    _write_labelled(rc, "db", {"team": "infra", "tier": "prod"})
    assert rc("plan", "-l", "team=infra", "-o", "name", check=2).out == "db\n"
    assert rc("plan", "-l", "team=search", "-o", "name", check=0).out == ""
    rc.once()
    assert rc.record("db")["labels"] == {"team": "infra", "tier": "prod"}
    assert rc.record("db")["ref"]["pid"] == pid

    assert rc("down", "-l", "team=infra", check=0).out == "stopped db\n"
    assert rc.status()["web"]["phase"] == "Ready"
    rc.down()


def test_a_selector_that_is_none_is_a_usage_error_naming_what_is_wrong(reconcile: Any) -> None:
    """`status -l 'bad key=@'` said "No deployments." (and `-l a=b,c=d` looked for the
    value "b,c=d"): every verb that takes -l refuses a selector that is none, as kubectl
    does, on one line that names the part that is wrong; `down` stops nothing."""
    rc = reconcile
    _write_labelled(rc, "web", {"team": "search"})
    rc.converge()
    said = "'bad key=@': label key 'bad key': the name must be at most 63 characters"
    for verb in (["status"], ["get"], ["describe"], ["plan"], ["down"]):
        bad = rc(*verb, "-l", "bad key=@", check=64).err
        assert said in bad and len(bad.splitlines()) == 1, bad
        assert "a selector is KEY, !KEY, KEY=VALUE, KEY!=VALUE, KEY in (A,B)" in bad, bad
    assert rc.status()["web"]["phase"] == "Ready"
    bad = rc("status", "-l", "team=search,,tier", check=64).err
    assert "'' in 'team=search,,tier': an empty requirement (a stray comma?)" in bad, bad
    rc.down()


def _write_labelled(rc: Any, name: str, labels: dict[str, str]) -> None:
    # Through the fixture, not `from conftest import`: another folder's conftest.py
    # (tests/ray, tests/daemon) may be the module named `conftest` by then.
    path = rc.write(name)
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["labels"] = labels
    path.write_text(yaml.safe_dump(doc))


def test_status_json_fields_are_the_documented_ones(reconcile: Any) -> None:
    """The README's table is the contract: every field there, with its type, and no other."""
    documented = _readme_fields()
    reconcile.write("web")
    reconcile.write("crashy", command=["/bin/false"], readiness=None, restartPolicy="Never")
    reconcile.once(check=None)
    items = reconcile("status", "-o", "json", check=0).json()
    assert isinstance(items, list) and [i["name"] for i in items] == ["crashy", "web"]
    for item in items:
        assert list(item) == [f for f in documented if f in item]  # no undocumented field
        assert set(item) == set(documented)
        for field, value in item.items():
            allowed = documented[field]
            assert type(value) in allowed, (field, value, allowed)
    reconcile.down()


def _readme_fields() -> dict[str, tuple[type, ...]]:
    text = (REPO / "README.md").read_text()
    # the status table alone: from its header to the first line that is not a row
    text = text[text.index("| field | type | meaning |") :].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+(?:\\\|[^|]+)*) \|", text, re.MULTILINE)
    fields: dict[str, tuple[type, ...]] = {}
    for name, kind in rows:
        top = re.sub(r"\[[^\]]*\]|\([^)]*\)", "", kind)  # list[...]: the list is the type
        words = [w.strip().split(" ")[0] for w in top.split("\\|")]
        fields[name] = tuple(TYPES[w] for w in words)
    assert "name" in fields and "labels" in fields, "the README's status table is gone"
    return fields


def test_logs_follow_is_a_real_option_and_f_dir_still_works_elsewhere(reconcile: Any) -> None:
    rc = reconcile
    folder = str(rc.manifests)
    # `-f DIR` after another verb is a folder, even when a deployment is named "logs".
    assert rc("describe", "logs", "-f", folder, check=1).err.startswith("reconcile: no deploy")
    unknown = "reconcile: no deployment named 'web'"  # nothing declares web: said, not followed
    assert rc("-f", folder, "logs", "web", check=1).err.startswith(unknown)
    assert rc("logs", "web", "--manifests", folder, check=1).err.startswith(unknown)
    assert rc("logs", "web", "-f", folder, check=64).code == 64  # -f takes no value there
    help_text = rc("logs", "--help", check=0).out
    assert "-f, --follow" in help_text


def test_a_busy_metrics_port_says_so_after_the_lock(reconcile: Any, tmp_path: Path) -> None:
    rc = reconcile
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        result = rc("--metrics-port", port, check=1)
        assert "already in use" in result.err and "I/O error" not in result.err, str(result)

        (rc.state / "instances").mkdir(parents=True, exist_ok=True)
        lock = FileLock(rc.state / "daemon.lock", what="daemon lock")
        assert lock.try_acquire()
        try:
            started = time.monotonic()
            held = rc("--metrics-port", port, check=1)
            assert "another reconcile daemon" in held.err and "in use" not in held.err
            assert time.monotonic() - started < 30
        finally:
            lock.release()


def test_describe_of_an_engine_without_a_probe_names_no_period(reconcile: Any) -> None:
    """Nothing is probed, so nothing runs every period: it said "none (ready once
    running) every 2s"."""
    reconcile.write("sleeper", command=["sleep", "300"], readiness={})
    reconcile.once()
    lines = reconcile("describe", "sleeper", check=0).out.splitlines()
    assert "Readiness:    none (ready once running)" in lines, lines
    reconcile.down()


def test_describe_of_an_idle_deployment_claims_no_probe_it_lacks(reconcile: Any) -> None:
    """An Idle deployment (OnDemand, or scaled to zero) has no engine and no probe in its
    record yet: describe said `Readiness: none (ready once running)` and `Liveness: none`
    beside a spec asking for GET /health, as if the spec asked for none."""
    rc = reconcile
    rc.write("od", activation="OnDemand")
    rc.write("zero", autoscale={"min": 0, "max": 1})
    rc.once()
    for name in ("od", "zero"):
        assert (rc.record(name) or {}).get("phase") == "Idle"
        lines = rc("describe", name, check=0).out.splitlines()
        assert "Readiness:    -" in lines and "Liveness:     -" in lines, lines
        assert "path: /health" in "\n".join(lines)  # the spec's probe, shown below
    rc.down()


@pytest.mark.parametrize(
    ("verb", "said"),
    [
        ("stauts", "'stauts' is no verb: did you mean `status`?"),
        ("Logs", "'Logs' is no verb: did you mean `logs`?"),
        ("apply", "'apply' is no verb of reconcile's: `reconcile --once` (one pass;"),
        ("ps", "'ps' is no verb of reconcile's: `reconcile status`"),
        ("rm", "'rm' is no verb of reconcile's: `reconcile down NAME`"),
        ("help", "'help' is no verb of reconcile's: `reconcile --help`"),
        # `flux suspend`: a Flux or Argo CD user's way to hold a source, a rollback's pin here
        ("suspend", "'suspend' is no verb of reconcile's: `reconcile rollback REV` with the"),
        ("resume", "'resume' is no verb of reconcile's: `reconcile rollback --resume`"),
        ("cordon", "'cordon' is no verb of reconcile's: `reconcile drain` (nothing new"),
        ("scale", "'scale' is no verb of reconcile's: set `spec.replicas` in the manifest"),
        ("edit", "'edit' is no verb of reconcile's: edit the manifest file"),
        ("rollout", "'rollout' is no verb of reconcile's: `reconcile restart NAME`"),
        # a newcomer's trial: kubectl's `explain`, docker's `pull` and `inspect` were
        # argparse's "invalid choice" with every verb listed
        ("explain", "'explain' is no verb of reconcile's: `reconcile schema` (every manifest"),
        ("pull", "'pull' is no verb of reconcile's: a pass pulls `spec.source` itself"),
        ("inspect", "'inspect' is no verb of reconcile's: `reconcile describe NAME`"),
        ("manifests/", "'manifests/' is no verb: give a folder or manifest with -f"),
        ("web.yaml", "(`reconcile -f web.yaml`)"),
        ("xyzzy", "invalid choice: 'xyzzy' (choose from 'plan', 'status'"),
    ],
)
def test_a_verb_that_is_none_names_the_one_meant(
    capsys: pytest.CaptureFixture[str], verb: str, said: str
) -> None:
    """kubectl's `apply`, compose's `ps`, a slip of the keys, a folder as the verb: argparse
    listed every verb; the one meant is named, on the one line a usage error is. kubectl's
    `cordon` got "did you mean `uncordon`?", the opposite of what it does."""
    with pytest.raises(SystemExit) as ended:
        build_parser().parse_args([verb])
    assert ended.value.code == 64
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and said in err and "--help" in err, err


def test_spec_image_alone_runs_a_process_and_a_missing_program_says_how_to_run_the_image(
    reconcile: Any,
) -> None:
    """compose's and Kubernetes' `image:` runs a container; here `spec.image` is export's,
    and the engine runs as a process. Its program missing on the node said to install it
    or set spec.executable, not that the image written was not run."""
    rc = reconcile
    image = "localhost/reconcile-test/engine:1"
    rc.write("imaged", command=["/no/such/engine", "{port}"], image=image)
    done = rc.once(check=None)
    record = rc.record("imaged")
    assert record is not None and record["container"] is None, record
    said = f"or run it in that image: `container: {{image: {image}}}`"
    assert said in record["message"] and "spec.image alone is for" in record["message"], done
    rc.down()
