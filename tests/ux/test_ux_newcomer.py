"""What a newcomer types wrong, each answered with where and the next move (DESIGN "The
command"): a file saved in Latin-1, one folder named twice, a flag misspelt.

Found by trying every verb's bad inputs: a manifest or node.yaml with a Latin-1 byte said
"not UTF-8 text" (or the codec's "position 60") with no line and no next move; `-f m -f m`
derived an owner of its own, so `plan` called the set's own deployment "owned by another
manifest set"; `--onse` was an unrecognized argument where `staus` got "did you mean"; a
Ctrl-C pressed at once, while Python still imported the command, printed importlib's stack;
a state dir on a full disk said "I/O error: No space left on device", naming no file;
`-f "$DIR"` with DIR unset (`-f ""`) read the current folder as the manifest set;
`describe Web` (a capital) was "refusing unsafe deployment name" (exit 1; `restart`: 64)
where `status Web` said "did you mean 'web'?".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from disks import fill, tmpfs

ENV = "RECONCILE_STATE_DIR"
LATIN1 = (
    b"apiVersion: reconcile/v1\nkind: Deployment\n"
    b"metadata: {name: web, labels: {team: caf\xe9}}\nspec: {engine: command, command: [x]}\n"
)


def test_a_manifest_not_in_utf8_names_the_line_and_the_next_move(reconcile: Any) -> None:
    bad = reconcile.manifests / "web.yaml"
    bad.write_bytes(LATIN1)
    result = reconcile("validate", check=1)
    said = f"{bad}:3: cannot read: not UTF-8 text (byte 0xe9 at column 41): save the file as UTF-8"
    assert said in result.err, result


def test_a_node_config_not_in_utf8_names_the_line_and_the_next_move(reconcile: Any) -> None:
    node = reconcile.tmp / "node.yaml"
    node.write_bytes(b"# the node\nlabels: {zone: z\xfcrich}\n")
    reconcile.write("web")
    result = reconcile("plan", "--node-config", str(node), check=1)
    said = f"{node}:2: cannot read: not UTF-8 text (byte 0xfc at column 17): save the file as UTF-8"
    shown = result.out + result.err
    assert said in shown and "codec" not in shown, result


def test_one_folder_named_twice_is_the_set_it_names_once(reconcile: Any) -> None:
    reconcile.write("web")
    folder = str(reconcile.manifests)
    reconcile.converge("-f", folder)
    twice = reconcile("plan", "-f", folder, "-f", f"{folder}/", check=0)
    assert "in sync" in twice.out.lower() and "another manifest set" not in twice.out, twice
    reconcile.down("-f", folder)


def test_a_file_named_beside_its_folder_is_the_set_the_folder_makes(reconcile: Any) -> None:
    """`-f m -f m/web.yaml` (a cron line and a daemon spelling the set otherwise) read the
    files `-f m` reads but derived another owner: the pass refused web as another set's."""
    reconcile.write("web")
    folder = str(reconcile.manifests)
    reconcile.converge("-f", folder)
    before = reconcile.record("web")
    assert before is not None, "converged, so web has a record"
    for order in ([folder, f"{folder}/web.yaml"], [f"{folder}/web.yaml", folder]):
        reconcile.once(*(arg for path in order for arg in ("-f", path)))
        after = reconcile.record("web")
        assert after is not None and after["owner"] == before["owner"] == folder, after
        assert after["ref"] == before["ref"], "the same engine, kept"
    down = reconcile.down("-f", folder, "-f", f"{folder}/web.yaml")
    assert reconcile.record("web") is None, down


@pytest.mark.parametrize("args", [["status", "--once"], ["plan", "--wait"], ["status", "--onse"]])
def test_the_commands_own_flag_after_a_verb_is_not_said_to_be_meant(
    reconcile: Any, args: list[str]
) -> None:
    """`--once` is refused after `status`: "did you mean `--once`?" (or `--onse` -> `--once`,
    refused there too) would send the user round in a circle."""
    result = reconcile(*args, check=64)
    assert f"unrecognized arguments: {args[1]} (see" in result.err, result


@pytest.mark.parametrize(
    ("args", "meant"),
    [
        (["--onse"], "--once"),
        (["status", "--outptu", "json"], "--output"),
        (["logs", "web", "--folow"], "--follow"),
        (["--once", "--wiat"], "--wait"),
        # its value was taken for the verb: "'/srv/state' is no verb", or every verb listed
        (["--state-dri", "/srv/state", "status"], "--state-dir"),
        (["--devcies", "nvidia:0", "devices"], "--devices"),
    ],
    ids=[
        "before-the-verb",
        "a-verbs-flag",
        "logs-flag",
        "beside-another",
        "a-global-flags-value-as-the-verb",
        "a-value-no-verb-is-like",
    ],
)
def test_a_misspelt_flag_gets_a_did_you_mean(reconcile: Any, args: list[str], meant: str) -> None:
    result = reconcile(*args, check=64)
    assert f"did you mean `{meant}`?" in result.err, result
    assert len(result.err.strip().splitlines()) == 1, result


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["events", "--for", "web"], "--for: `reconcile events NAME`"),
        (["logs", "web", "--since", "1m"], "--since 1m: `--tail N`"),
        (["status", "-A"], "-A: a node has no namespaces: `reconcile status` lists every"),
        (["get", "--show-labels"], "--show-labels: `-o json` (each item's `labels`)"),
    ],
    ids=["events-for", "logs-since", "all-namespaces", "show-labels"],
)
def test_a_kubectl_flag_gets_reconciles_way(reconcile: Any, args: list[str], said: str) -> None:
    """kubectl's `events --for`, `logs --since`, `get -A` were "unrecognized arguments"
    alone: the way reconcile does it is named, on the usage error's one line."""
    result = reconcile(*args, check=64)
    assert f"unrecognized arguments: {said}" in result.err, result
    assert len(result.err.strip().splitlines()) == 1, result


# A real SIGINT, sent as the command starts importing its modules (a person's Ctrl-C at once)
CTRL_C_AT_IMPORT = """
import os, runpy, signal, sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "controller.cli.main":
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["reconcile", "status"]
runpy.run_module("controller", run_name="__main__")
"""


def test_ctrl_c_while_the_command_starts_is_130_without_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "RECONCILE_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_AT_IMPORT],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 130, done
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done


def test_a_state_dir_on_a_full_disk_names_the_file(reconcile: Any) -> None:
    reconcile.write("web")
    with tmpfs(reconcile.tmp / "small", "64k") as small:
        state = small / "state"
        state.mkdir(mode=0o700)
        fill(small)
        node = ["--node", reconcile.node, "--devices", reconcile.devices]
        where = ["--state-dir", str(state), "-f", str(reconcile.manifests)]
        result = reconcile("--once", *where, *node, common=False, check=1)
    assert f"reconcile: I/O error: {state}/" in result.err, result
    assert "No space left on device. Fix the disk" in result.err, result


@pytest.mark.parametrize(
    "args",
    [["--once", "-f", ""], ["plan", "-f", " "], ["logs", "--manifests", ""], ["status", "-f", ""]],
    ids=["once", "plan", "logs", "status"],
)
def test_an_empty_folder_is_a_usage_error_not_the_current_folder(
    reconcile: Any, args: list[str]
) -> None:
    """`-f "$DIR"` with DIR unset: the pass read the folder it ran in as the manifest set."""
    reconcile.write_text("here.yaml", "not: a manifest\n", folder=reconcile.tmp)
    state = ["--state-dir", str(reconcile.state), "--node", reconcile.node]
    result = reconcile(*args, *state, common=False, check=64)
    assert "--manifests: is empty: name a path (an unset shell variable?)" in result.err, result
    assert "here.yaml" not in result.out + result.err, result


def test_an_empty_state_dir_is_a_usage_error_not_the_default_one(reconcile: Any) -> None:
    result = reconcile("status", "--state-dir", "", common=False, check=64)
    assert "--state-dir: is empty: name a path (an unset shell variable?)" in result.err, result


@pytest.mark.parametrize("verb", ["status", "--once", "plan", "events", "down"])
def test_a_state_dir_that_is_a_file_is_a_usage_error_naming_it(reconcile: Any, verb: str) -> None:
    """`--state-dir manifests/demo.yaml` (a slip): every verb went on, warned of a state
    file skipped, then said "I/O error: .../instances: Not a directory. Fix the disk or
    permissions" (exit 1; `events`: "No events.", exit 0). The variable is checked alike."""
    afile = reconcile.write_text("demo.yaml", "not: a folder\n", folder=reconcile.tmp)
    node = ["--node", reconcile.node, "-f", str(reconcile.manifests)]
    if verb in ("events", "status"):
        node = node[:2]
    said = f"{afile} is a file, not a folder: name the state dir's folder (made if missing)"
    result = reconcile(verb, "--state-dir", str(afile), *node, common=False, check=64)
    assert f"--state-dir: {said}" in result.err and "I/O error" not in result.err, result
    under = reconcile(verb, *node, common=False, check=64, env={ENV: f"{afile}/state"})
    assert f"{ENV}: {afile}/state lies under {afile}, which is a file" in under.err, under
    assert afile.read_text() == "not: a folder\n" and not reconcile.state.exists()


def test_a_wait_that_times_out_says_where_each_stands_and_what_next(reconcile: Any) -> None:
    """`--once --wait --timeout 3s` on an engine still loading, and one whose program is
    not there, said `reconcile: timed out waiting for slow, typo`: not where each stood
    (nor why the back-off), that they go on, or what to do next."""
    rc = reconcile
    slow = {"httpGet": {"path": "/health"}, "deadlineSeconds": 300}
    rc.write("slow", basePort=rc.port, command=["sleep", "300"], readiness=slow)
    rc.write("typo", basePort=rc.port + 1, command=["nosuchbinary"])
    result = rc("--once", "--wait", "--timeout", "2s", check=1)
    said = ") after 2s (--timeout): the engines go on"
    assert "timed out waiting for slow (Starting), typo (BackOff: cannot exec 'nosuchbinary'" in (
        result.err
    ), result
    assert "correct spec.command[0]" in result.err and said in result.err, result
    assert "`reconcile status` shows where they stand, `reconcile logs NAME` why" in result.err
    assert rc.record("slow")["phase"] == "Starting"  # the wait ended, not the engine
    rc.down()


def test_a_timeout_without_wait_is_a_usage_error_not_a_limit_given_in_vain(
    reconcile: Any,
) -> None:
    """`--once --timeout 5m` read as a limit, and silently none: the pass ran unbounded."""
    reconcile.write("web")
    result = reconcile("--once", "--timeout", "5m", check=64)
    assert "--timeout is --wait's limit: add --once --wait" in result.err, result
    assert reconcile.record("web") is None  # refused before any pass
    reconcile("--once", "--wait", check=0)  # no --timeout: the 10m default
    assert reconcile.status("web")["web"]["phase"] == "Ready"
    reconcile.down()


@pytest.mark.parametrize("verb", ["describe", "logs", "events", "restart", "status"])
def test_a_name_no_deployment_can_have_gets_the_one_meant(reconcile: Any, verb: str) -> None:
    reconcile.write("web")
    reconcile.once()
    result = reconcile(verb, "Web", check=1)
    assert "no deployment named 'Web'" in result.err and "did you mean 'web'?" in result.err
    assert "unsafe" not in result.err, result
    reconcile.down()
