"""What a kubectl, compose or cron user trips over in the first hour (issue 25), through
the real CLI: exit codes cron and CI can trust, `-f FILE`, and errors that say what to write.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def test_a_missing_folder_fails_validate_and_once_and_prunes_nothing(reconcile: Any) -> None:
    """A mistyped cron or CI path (`-f manfests`) must not go green."""
    rc = reconcile
    rc.write("web")
    rc.converge()
    pid = rc.status()["web"]["pid"]
    typo = rc.tmp / "manfests"
    checked = rc("validate", "-f", str(typo), check=1)
    assert f"manifests folder {typo} does not exist" in checked.err
    assert "valid" not in checked.out
    once = rc("--once", "-f", str(typo), "--owner", str(rc.manifests), check=1)
    assert f"manifests folder {typo} does not exist" in once.err
    assert rc.status()["web"]["pid"] == pid  # invariant 5: nothing pruned
    rc.down()


def test_a_missing_manifest_file_is_called_a_file(reconcile: Any) -> None:
    """`-f web.yaml` (a file, as kubectl takes it) gone: validate, `--once` and `status`
    called it "manifests folder .../web.yaml does not exist"."""
    rc = reconcile
    web = rc.write("web")
    rc.converge("-f", str(web))
    pid = rc.status()["web"]["pid"]
    web.unlink()
    said = f"manifest file {web} does not exist"
    checked = rc("validate", "-f", str(web), check=1)
    assert f"error: {said}" in checked.err and "folder" not in checked.err, checked.err
    once = rc("--once", "-f", str(web), check=1)
    assert said in once.err and "folder" not in once.err, once.err
    assert rc.status()["web"]["pid"] == pid  # invariant 5: nothing pruned
    assert said in rc("status", "-f", str(web), check=0).out
    rc.write("web")
    rc.down("-f", str(web))


def test_an_emptied_folder_fails_once_with_the_way_out(reconcile: Any) -> None:
    rc = reconcile
    rc.write("web")
    rc.converge()
    (rc.manifests / "web.yaml").unlink()
    once = rc.once(check=1)
    said = f"no manifest in {rc.manifests} (it is empty): nothing pruned (--allow-empty to prune)"
    assert said in once.err, str(once)
    assert rc.status()["web"]["phase"] == "Ready"
    rc.once("--allow-empty", check=0)
    assert rc.status() == {}


def test_validate_fails_on_a_folder_with_no_manifest_in_the_words_of_once(reconcile: Any) -> None:
    """`validate` on a folder of a README exited 0 with "0 deployment(s) in 0 file(s):
    valid": a CI job checking a mistyped or emptied folder went green. As kubectl's "no
    objects passed to apply", it fails naming the folder and what it passed over, in the
    words `--once` and `plan` use; `--allow-empty`, before or after the verb, accepts it."""
    rc = reconcile
    rc.write_text("README.md", "how to deploy\n")
    said = f"error: no manifest in {rc.manifests} (ignored README.md: manifests are .yaml or "
    said += ".yml files): nothing"
    checked = rc("validate", check=1)
    assert f"{said} to validate" in checked.err and "valid" not in checked.out, str(checked)
    assert f"{said} pruned (--allow-empty to prune)" in rc.once(check=1).err
    assert said.removeprefix("error: ") + " pruned" in rc("plan", check=1).out
    for args in (["validate", "--allow-empty"], ["--allow-empty", "validate"]):
        assert "0 deployment(s) in 0 file(s): valid" in rc(*args, check=0).out
    for args in (["plan", "--allow-empty"], ["--allow-empty", "plan"]):
        assert "In sync" in rc(*args, check=0).out  # `--allow-empty plan` ignored it


def test_manifests_one_folder_down_are_named_where_none_is_found(reconcile: Any) -> None:
    """`-f m` with the manifests in m/engines/: `validate`, `--once` and `plan` fail naming
    the subfolder instead of a bare "holds no manifest"."""
    rc = reconcile
    (rc.manifests / "engines").mkdir()
    (rc.manifests / "engines" / "web.yaml").write_text(rc.dump_yaml(rc.deployment("web")))
    hint = f"({rc.manifests / 'engines'} holds 1: -f reads one folder, not its subfolders)"
    said = f"error: no manifest in {rc.manifests} {hint}: nothing"
    assert f"{said} to validate" in rc("validate", check=1).err
    assert f"{said} pruned" in rc.once(check=1).err
    assert f"no manifest in {rc.manifests} {hint}: nothing pruned" in rc("plan", check=1).out


def test_once_fails_while_a_deployment_crash_loops(reconcile: Any) -> None:
    """BackOff after a failed restart is exit 1, naming it: cron mails."""
    rc = reconcile
    # A probe nothing answers: with none, a restart seen running before its `exit 3` was
    # Ready at once, and a run that was Ready and then died is no loop (exit 0): the test
    # raced `sh` under load (seen once the demo engine beside it came up faster).
    never = {"httpGet": {"path": "/health"}, "periodSeconds": 0.2}
    rc.write("crashy", command=["sh", "-c", "exit 3"], readiness=never)
    rc.write("fine")
    deadline = time.monotonic() + 60
    while True:
        result = rc.once(check=None)
        phase = rc.status()["crashy"]["phase"]
        if phase == "BackOff" or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert phase == "BackOff", rc.status()
    assert result.code == 1 and "crashy is crash-looping" in result.err, str(result)
    errors = [line for line in result.err.splitlines() if line.startswith("error:")]
    assert errors and all("crashy" in line for line in errors), errors
    rc.down()


def test_f_takes_a_single_manifest_file(reconcile: Any) -> None:
    """kubectl's habit: `-f web.yaml` (one clear message if it is not there)."""
    rc = reconcile
    path = rc.write("web")
    assert "1 deployment(s) in 1 file(s): valid" in rc("validate", "-f", str(path), check=0).out
    gone = rc("validate", "-f", str(path.with_name("nope.yaml")), check=1).err
    assert "does not exist" in gone and "Not a directory" not in gone
    other = rc.write_text("passwd", "root:x:0:0::/root:/bin/sh\n", folder=rc.tmp)
    for verb in (["validate"], ["--once"]):  # said "does not exist" (issue 34, item 23)
        err = rc(*verb, "-f", str(other), check=1).err
        assert "is not a folder, nor a manifest file (.yaml, .yml)" in err, err
        assert "does not exist" not in err and "manifests folder missing" not in err, err
    rc("--once", "-f", str(path), check=0)
    assert rc.status()["web"]["phase"] in ("Starting", "Ready")
    rc("down", "-f", str(path), check=0)


def test_a_path_f_cannot_read_is_said_once(reconcile: Any) -> None:
    """`--once -f run.sh` (a script, a binary: no YAML) said its error three times (the
    error, a "pruning nothing" warning, the folder again), `plan` and `export` twice, and a
    missing folder was said twice by `--once`: each is one line, with the next move."""
    rc = reconcile
    script = rc.write_text("run.sh", "#!/bin/sh\nexec llama-server\n", folder=rc.tmp)
    binary = rc.tmp / "engine.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    said = "is not a folder, nor a manifest file (.yaml, .yml)"
    for path in (script, binary):
        for verb in (["--once"], ["plan"], ["plan", "-o", "json"], ["export"], ["validate"]):
            done = rc(*verb, "-f", str(path), check=1)
            assert (done.out + done.err).count(said) == 1, done
            assert f"{path}: {said}: -f takes a folder or one manifest file" in str(done), done
    missing = rc.tmp / "manfests"
    once = rc("--once", "-f", str(missing), check=1)
    meant = f"(did you mean {rc.manifests}?)"
    line = f"error: manifests folder {missing} does not exist {meant}: nothing pruned"
    assert once.err == f"{line} (--allow-empty to prune)\n", once


def test_errors_say_what_to_write(reconcile: Any) -> None:
    rc = reconcile
    rc.write_text(
        "m.yaml",
        "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: m}\nspec:\n"
        "  engine: command\n  command: python3 -m http.server {port}\n"
        "  readiness: {periodSecond: 2}\n",
    )
    rc.write_text(
        "k8s.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: k8s}\nspec: {replicas: 1}\n",
    )
    err = rc("validate", check=1).err
    assert 'write command: ["python3", "-m", "http.server", "{port}"]' in err
    assert "spec.readiness.periodSecond: unknown field: did you mean `periodSeconds`?" in err
    assert "k8s.yaml:1: apiVersion: not a reconcile manifest (apps/v1 Deployment)" in err
    rc.once(check=1)
    assert "k8s" not in rc.status(), "a Kubernetes object gets no record"


def test_plan_fails_whenever_once_would(reconcile: Any, tmp_path: Any) -> None:
    """The GitOps job runs `plan`: a name another set owns (`! wait`) or a missing folder
    is exit 1 as `--once` would be, never 'In sync'; a probe passing is no update."""
    rc = reconcile
    rc.write("chat")
    rc.converge()
    other = tmp_path / "other"
    other.mkdir()
    rc.write("chat", folder=other)
    planned = rc("plan", "-f", str(other), check=1)
    assert "! chat" in planned.out and "In sync" not in planned.out, planned.out
    assert rc("--once", "-f", str(other), check=1).code == 1
    missing = rc("plan", "-f", str(tmp_path / "nope"), check=1)
    assert "does not exist" in missing.out + missing.err
    rc.write("slow", command=rc.demo_command(load_seconds="1"))
    rc.once()  # slow is Starting; its probe will pass before the next pass
    port = rc.record("slow")["port"]
    rc.wait_for(lambda: _healthy(port), timeout=30, what="slow's /health answering 200")
    doc = rc("plan", "-o", "json", check=None).json()
    assert doc["summary"]["in-place"] == 0, doc
    rc.down()


def test_the_shipped_demo_runs_from_a_cron_like_environment(reconcile: Any) -> None:
    """cron, systemd and other users have a PATH whose `python3` is not reconcile's venv:
    the demo names `{python}`, the interpreter reconcile runs under, and comes up."""
    rc = reconcile
    shipped = Path(__file__).parents[2] / "manifests" / "demo.yaml"
    text = shipped.read_text().replace("basePort: 8000", f"basePort: {rc.port}")
    rc.write_text("demo.yaml", text)
    rc("--once", "--wait", "--timeout", "60s", env={"PATH": "/usr/bin:/bin"}, check=0)
    rec = rc.record("demo")
    assert rec["phase"] == "Ready", rec
    rc.down()


def test_a_closed_pipe_is_no_disk_error(reconcile: Any) -> None:
    """`reconcile schema | head -c 300`: quiet, exit 0, not 'I/O error: fix the disk'."""
    import subprocess

    rc = reconcile
    for name in ("a", "b", "c"):
        rc.write(name)
    rc.once()
    for verb in (["schema"], ["status", "-o", "json"]):
        argv = rc.argv(*verb)
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()  # the reader is gone before a byte is written, as `head`'s
            err = proc.stderr.read().decode()
            code = proc.wait(timeout=30)
        assert code == 0 and err == "", (verb, err)
    rc.down()


def test_usage_errors_are_one_line_and_verb_is_optional(reconcile: Any) -> None:
    bad = reconcile("--timeout", "soon", "--once", check=64).err
    assert len(bad.splitlines()) == 1 and "--timeout" in bad and "--help" in bad, bad
    assert "[VERB]" in reconcile("--help", check=0).out


def test_wait_ends_on_a_crash_loop_with_its_last_exit(reconcile: Any) -> None:
    """`--wait` used to wait a crash loop out to --timeout (10 minutes by default).

    Its engine has a readiness probe nothing answers: one without is Ready as soon as it
    runs, and a loaded box's `sh` that had not exited yet when a pass looked was Ready,
    so the wait ended at once, exit 0 (a CI run at load ~20)."""
    rc = reconcile
    never = {"httpGet": {"path": "/health"}, "periodSeconds": 0.2}  # nothing listens
    rc.write("crashy", command=["sh", "-c", "exit 7"], readiness=never)
    result = rc("--once", "--wait", "--timeout", "5m", check=1, timeout=200)
    assert "crashy keeps failing" in result.err and "7" in result.err, result.err
    # ended at the bound: the wait's first pass made the immediate restart, so the first
    # back-off's restart is the second (the next back-off, 20 s more, is not waited for)
    assert "(2 restarts; last: exited with code 7)" in result.err, result.err
    assert "timed out" not in result.err
    rc.down()


def test_a_later_deployment_of_a_removed_ones_name_has_its_own_events(reconcile: Any) -> None:
    """A pruned deployment's journal stayed, so a later deployment of the same name showed
    the removed one's history as its own in `events NAME` and `describe` (Kubernetes
    ties events to the object's uid). The prune says `removed` once the last record is
    gone; by name, only the deployment now under it is shown; `events` keeps it all."""
    import json

    rc = reconcile
    rc.write("keep")  # the folder is not emptied: the pass may prune (invariant 5)
    rc.write("web", replicas=2, basePort=rc.port + 10)
    rc.converge()
    (rc.manifests / "web.yaml").unlink()
    rc.once()
    gone = [
        json.loads(line) for line in rc("events", "web", "-o", "json", check=0).out.splitlines()
    ]
    removals = [e for e in gone if e["action"] == "removed"]
    assert len(removals) == 1 and gone[-1] == removals[0], gone  # one, after both replicas
    assert removals[0]["reason"].startswith("manifest removed"), removals
    assert removals[0]["outcome"] == (  # what happened, and that nothing is amiss
        "removed with its manifest, nothing of it runs now: its events end here"
        " (a new deployment of this name starts its own)"
    ), removals
    # describe, like kubectl, finds no such deployment, and says where its story is kept
    told = rc("describe", "web", check=1).err
    assert "no deployment named 'web'" in told, told
    assert "web was removed " in told and "ago, manifest removed" in told, told
    assert "`reconcile events web`" in told and "`reconcile logs web`" in told, told
    rc.write("web", basePort=rc.port + 10, env={"LATER": "1"})
    rc.converge()
    own = [json.loads(line) for line in rc("events", "web", "-o", "json", check=0).out.splitlines()]
    assert own and all(e["time"] > removals[0]["time"] for e in own), own
    assert own[0]["action"] == "start", own
    described = rc("describe", "web", check=0).out
    assert "removed" not in described and "stopped; record dropped" not in described
    every = rc("events", "-o", "json", check=0).out.splitlines()
    actions = [json.loads(line)["action"] for line in every if '"web"' in line]
    assert actions.count("removed") == 1 and actions.index("removed") < len(actions) - 1
    rc.down()


def test_events_lists_every_journal_and_follows(reconcile: Any) -> None:
    """kubectl's `get events` (and `-w`): newest last, every deployment, JSON lines too."""
    import json
    import subprocess

    rc = reconcile
    rc.write("alpha")
    rc.write("beta")
    rc.converge()
    text = rc("events", check=0).out
    lines = text.splitlines()
    assert lines[0].split() == ["AGE", "DEPLOYMENT", "ACTION", "OUTCOME", "REASON"]
    assert any(" alpha " in f" {line} " for line in lines[1:])
    assert any(" beta " in f" {line} " for line in lines[1:])
    only = rc("events", "alpha", "-o", "json", check=0).out.splitlines()
    assert only and all(json.loads(line)["deployment"] == "alpha" for line in only)
    assert "no deployment named 'nope'" in rc("events", "nope", check=1).err
    with subprocess.Popen(rc.argv("events", "-w", "-o", "json"), stdout=subprocess.PIPE) as w:
        assert w.stdout is not None
        before = [w.stdout.readline() for _ in only]  # what exists is printed first
        rc.write("gamma")
        rc.once()
        fresh = json.loads(next(line for line in w.stdout if b'"gamma"' in line))
        w.terminate()
        w.stdout.close()
    assert before and fresh["deployment"] == "gamma"
    rc.down()


def test_events_and_describe_say_why_a_start_failed(reconcile: Any) -> None:
    """A start that failed was `start  failed  spawn` in `events` and `describe` (one
    left Pending by its backend: `pending  placement`): the words of what failed (a
    runtime's refusal, a container's exit at its start, an image `Never` will not pull)
    were in `events -o json` alone."""
    rc = reconcile
    rc.write("broken", command=["/no/such/engine", "{port}"])
    rc.once(check=None)
    said = "spawn: cannot exec '/no/such/engine': No such file or directory"
    rows = [line for line in rc("events", "broken", check=0).out.splitlines() if "failed" in line]
    assert rows and rows[0].rstrip().endswith(said), rows
    described = rc("describe", "broken", check=0).out
    assert any(line.rstrip().endswith(said) for line in described.splitlines()), described
    rc.down()


def test_a_program_not_found_names_the_field_and_line_that_name_it(reconcile: Any) -> None:
    """A typo in an `engine: command` program said `install the engine or set
    spec.executable`: a field that is no fix for a command's argv, and no file or line.
    Now the message names the field that names the program (spec.command[0], or
    spec.executable where set), the manifest and the line (and, for a bare name, the PATH
    its start searched)."""
    rc = reconcile
    typo = rc.write("typo", command=["pyhton3-no-such", "-m", "http.server", "{port}"])
    exe = rc.write("exe", command=["python3", "{port}"], executable="/no/such/engine")
    rc.once(check=None)
    status = rc.status("typo", "exe")
    typo_line = next(
        n for n, line in enumerate(typo.read_text().splitlines(), 1) if "pyhton3" in line
    )
    exe_line = next(
        n for n, line in enumerate(exe.read_text().splitlines(), 1) if "executable" in line
    )
    assert status["typo"]["message"] == (
        "cannot exec 'pyhton3-no-such': No such file or directory: install it or correct "
        f"spec.command[0] (a program on PATH, or its path) ({typo}:{typo_line}); searched "
        f"reconcile's own PATH (spec.env's PATH sets another): {rc.env['PATH']}"
    ), status["typo"]
    assert status["exe"]["message"] == (
        "cannot exec '/no/such/engine': No such file or directory: install it or correct "
        f"spec.executable ({exe}:{exe_line})"
    ), status["exe"]
    rc.down()


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:  # refused, or 503 while it loads (HTTPError is an OSError)
        return False


def test_wait_ends_when_a_rolling_update_has_taken_over(reconcile: Any) -> None:
    """`--once --wait` after a spec change is `kubectl rollout status`: it returns once the
    new instance serves, not while the old one still does beside a `@next` on its way (the
    new engine here needs 3 s to load, longer than the pass's rounds)."""
    rc = reconcile
    spec = {"strategy": "RollingUpdate", "devices": {"count": 1, "kind": "nvidia"}}
    rc.devices = "nvidia:0,nvidia:1"
    rc.write("web", **spec)
    rc.converge()
    old = rc.status()["web"]["pid"]
    engine = [sys.executable, "-m", "controller.demo.engine", "--port", "{port}"]
    rc.write("web", command=[*engine, "--load-seconds", "3"], **spec)
    rc.converge()
    now = rc.status()
    assert set(now) == {"web"}, now  # no web@next left
    assert now["web"]["phase"] == "Ready" and now["web"]["pid"] != old, now
    rc.down()


def test_a_crash_loops_dead_engine_shows_no_pid_as_if_it_ran(reconcile: Any) -> None:
    """In BackOff the engine has exited (its group reaped; `down` says "not running"),
    yet `status -o wide`, `describe` and `status -o json`'s `pid` showed its pid as the
    engine's: one `kill` away from a process that reused it. The JSON keeps it as
    `last_exit.pid`, as Kubernetes keeps a crash-looping container's `lastState`."""
    rc = reconcile
    rc.write("crashy", command=["sh", "-c", "exit 3"], readiness={"periodSeconds": 0.2})
    backoff = lambda: (rc.once(check=None), rc.status()["crashy"]["phase"] == "BackOff")[1]  # noqa: E731
    rc.wait_for(backoff, timeout=60, what="crashy in BackOff")
    dead = rc.record("crashy")["ref"]["pid"]
    wide = rc("status", "-o", "wide", check=0).out.splitlines()
    column = wide[0].index(" PID ") + 1  # a table's columns are aligned under their heads
    assert wide[1][column:].split()[0] == "-", wide
    pid_line = next(line for line in rc("describe", "crashy").out.splitlines() if "PID:" in line)
    assert pid_line.split()[1] == "-" and f"the last, {dead}, has exited" in pid_line, pid_line
    item = rc("status", "crashy", "-o", "json", check=0).json()[0]
    assert item["pid"] is None and item["last_exit"]["pid"] == dead, item
    assert [i["pid"] for i in item["instances"]] == [None], item
    rc.down()


def test_a_relative_model_path_is_refused_at_its_line_with_the_way_out(reconcile: Any) -> None:
    """`model: ./models/x.gguf` named a file beside the engine's runtime dir (a process)
    and no mounted folder (a container): refused where it is written, never guessed."""
    rc = reconcile
    path = rc.manifests / "tiny.yaml"
    (rc.manifests / "models").mkdir()
    (rc.manifests / "models" / "x.gguf").write_bytes(b"GGUF")
    for written in ("./models/x.gguf", "../x.gguf", "~/x.gguf"):
        path.write_text(
            "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: tiny}\n"
            f"spec:\n  engine: llama-cpp\n  model: {written}\n"
        )
        checked = rc("validate", check=1)
        assert f"{path}:6: spec.model: {written!r} is a relative path" in checked.err, checked
        assert "write the file's absolute path" in checked.err
        assert "Traceback" not in checked.err
    path.write_text(path.read_text().replace("~/x.gguf", str(rc.manifests / "models/x.gguf")))
    rc("validate", check=0)
