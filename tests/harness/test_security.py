"""Security: strict modes as root, private state, names that stay home, secrets never shown."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from typing import Any

import pytest

from .cluster import Cluster, alive
from .invariants import read_records

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="strict modes apply to root only")


def _engine_pid(cluster: Cluster, name: str) -> int:
    rec = read_records(cluster.state)[0][name]
    assert rec.ref is not None and alive(rec.ref.pid), rec
    return rec.ref.pid


# -- strict modes --------------------------------------------------------------------------


@as_root
@pytest.mark.parametrize(
    ("what", "mode", "uid"),
    [
        ("file", 0o666, 0),
        ("file", 0o644, NOBODY),
        ("folder", 0o775, 0),
        ("folder", 0o755, NOBODY),
        ("symlink-target", 0o664, 0),
    ],
)
def test_root_refuses_manifests_others_can_write(
    cluster: Cluster, what: str, mode: int, uid: int
) -> None:
    path = cluster.write("a0")
    folder = cluster.sets["a"]
    if what == "symlink-target":
        # Inside the folder (a ConfigMap-style link): one that leaves it is refused unread.
        target = folder / ".a0-target.yaml"
        path.rename(target)
        path.symlink_to(target.name)
        path = target
    victim = folder if what == "folder" else path
    victim.chmod(mode)
    os.chown(victim, uid, -1)
    try:
        for verb in ("validate", "--once", "plan")[: 3 if what == "file" and uid else 2]:
            run = cluster.run(verb)
            said = run.out + run.err  # plan prints its errors with the plan
            assert run.code == 1 and "Traceback" not in said, str(run)
            named = folder if what == "folder" else folder / "a0.yaml"
            assert "--insecure-manifests" in said and str(named) in said, str(run)
        assert "a0" not in read_records(cluster.state)[0], "a refused manifest was started"
        opted = cluster.run("validate", "--insecure-manifests")
        assert opted.code == 0, str(opted)
    finally:
        os.chown(victim, 0, -1)
        victim.chmod(0o755 if what == "folder" else 0o644)


@as_root
def test_a_refused_manifest_keeps_its_engine(cluster: Cluster) -> None:
    """Invariant 4: a manifest turned world-writable stops being trusted, not its engine."""
    path = cluster.write("a0")
    assert cluster.once().code == 0
    pid = _engine_pid(cluster, "a0")
    path.chmod(0o666)
    run = cluster.once()
    assert run.code == 1 and "refused" in run.err, str(run)
    rec = read_records(cluster.state)[0]["a0"]
    assert rec.spec_valid is False and "--insecure-manifests" in rec.message, rec
    assert _engine_pid(cluster, "a0") == pid
    path.chmod(0o644)
    assert cluster.once().code == 0
    assert _engine_pid(cluster, "a0") == pid


@as_root
def test_root_refuses_a_state_dir_another_user_owns(cluster: Cluster) -> None:
    cluster.state.mkdir(mode=0o700)
    os.chown(cluster.state, NOBODY, -1)
    cluster.write("a0")
    run = cluster.once()
    assert run.code == 1 and "Traceback" not in run.err and "chown" in run.err, str(run)
    assert not list(cluster.state.iterdir()), "wrote into a state dir another user owns"
    os.chown(cluster.state, 0, -1)


@as_root
def test_root_refuses_a_state_dir_symlink_another_user_owns(cluster: Cluster) -> None:
    real = cluster.tmp / "real-state"
    real.mkdir(mode=0o700)  # root's own folder: only the link is another user's
    cluster.state.symlink_to(real)
    os.lchown(cluster.state, NOBODY, -1)
    cluster.write("a0")
    run = cluster.once()
    assert run.code == 1 and "Traceback" not in run.err, str(run)
    assert f"{cluster.state} is a symlink owned by uid {NOBODY}, not root" in run.err, str(run)
    assert not list(real.iterdir()), "wrote through a symlink another user owns"
    os.lchown(cluster.state, 0, -1)
    assert cluster.once().code == 0  # root's own link is followed
    assert (real / "instances" / "a0.json").exists()


@as_root
def test_root_refuses_an_api_keys_file_another_user_owns(reconcile: Any) -> None:
    keys = reconcile.tmp / "keys.txt"
    keys.write_text("sk-someone-elses-key\n")
    os.chmod(keys, 0o600)
    os.chown(keys, NOBODY, -1)
    listen = str(reconcile.port + 15)
    result = reconcile("--listen", listen, "--api-keys", str(keys), check=64, timeout=30)
    assert f"--api-keys {keys} is owned by uid {NOBODY}, not root" in result.err, str(result)
    assert f"chown root {keys}" in result.err and "sk-someone" not in result.err


@as_root
def test_root_refuses_envfrom_files_another_user_owns(reconcile: Any) -> None:
    """An envFrom file (0600, as its rule asks) owned by another user: that user would set
    a root engine's environment (LD_PRELOAD: their code, run as root). Refused as a
    manifest would be, naming the file; --insecure-manifests trusts it as it trusts them."""
    node_file = reconcile.tmp / "node.env"
    node_file.write_text("LD_PRELOAD=/tmp/not-there.so\n")
    os.chmod(node_file, 0o600)
    os.chown(node_file, NOBODY, -1)
    reconcile.write("web", envFrom=[{"file": str(node_file)}])
    result = reconcile.once(check=1)
    said = f"spec.envFrom[0]: file {node_file} is owned by uid {NOBODY}, not root"
    assert said in result.err and f"chown root {node_file}" in result.err, str(result)
    assert "not-there" not in result.out + result.err and not reconcile.pids("web")
    assert reconcile.once("--insecure-manifests", "--wait", check=0).code == 0
    reconcile.down()


# -- private state ---------------------------------------------------------------------------


def test_state_is_private_even_with_umask_0(cluster: Cluster) -> None:
    cluster.state.mkdir(mode=0o755)
    os.chmod(cluster.state, 0o755)
    cluster.write("a0")
    cluster.write("a1")
    old = os.umask(0)
    try:
        assert cluster.once().code == 0
        assert cluster.run("drain", "--ttl", "1m").code == 0
        assert cluster.run("uncordon").code == 0
        os.umask(old)
        cluster.write("a0", version=1)  # a replace: events, a fresh log marker
        cluster.remove("a1")
        os.umask(0)
        assert cluster.once().code == 0
    finally:
        os.umask(old)
    loose = []
    for path in [cluster.state, *cluster.state.rglob("*")]:
        info = path.lstat()
        if info.st_mode & 0o077 and not stat.S_ISLNK(info.st_mode):
            loose.append(f"{path.relative_to(cluster.tmp)} {stat.filemode(info.st_mode)}")
    assert loose == [], f"state readable by others: {loose}"


# -- names ---------------------------------------------------------------------------------------

FULLWIDTH = "\uff46\uff55\uff4c\uff4c"  # "full" in look-alike letters
BAD_NAMES = ["../escape", "a/b", "..", ".", "Upper", "x" * 64, FULLWIDTH, "-lead", "trail-", "a b"]


def test_names_never_escape_the_state_dir(cluster: Cluster) -> None:
    folder = cluster.sets["a"]
    for i, name in enumerate(BAD_NAMES):
        doc = cluster.manifest("ok")
        doc["metadata"]["name"] = name
        (folder / f"bad-{i}.yaml").write_text(json.dumps(doc))
    for verb in ("validate", "--once"):
        run = cluster.run(verb)
        assert run.code == 1 and "Traceback" not in run.err, str(run)
        assert all(f"bad-{i}.yaml" in run.err for i in range(len(BAD_NAMES))), str(run)
    for verb in ("describe", "logs", "status"):
        for name in ("../../../etc/passwd", "../state", "a/../../b"):
            run = cluster.run(verb, name)
            assert run.code != 0 and "Traceback" not in run.err, str(run)
            assert "root:" not in run.out
    made = {p.name for p in cluster.tmp.rglob("*")}
    assert not {n for n in made if "escape" in n or n == "b"}, made
    run = cluster.run("--once", "--node", "a/b")  # a bad flag value: a usage error (64)
    assert run.code == 64 and "Traceback" not in run.err, str(run)


# -- secrets -----------------------------------------------------------------------------------

SECRETS = {
    "HF_TOKEN": "s3cr3t-token",
    "OPENAI_API_KEY": "s3cr3t-key",
    "DB_PASSWORD": "s3cr3t-password",
    "client_secret": "s3cr3t-secret",
}


def test_secrets_never_shown(cluster: Cluster) -> None:
    env = {**SECRETS, "PLAIN": "visible-value"}
    command = [*cluster.manifest("x")["spec"]["command"], "--api-key", "s3cr3t-arg"]
    cluster.write("a0", env=env, command=command)
    outputs = [cluster.run("--once", "-v")]
    env["HF_TOKEN"] = "s3cr3t-changed"
    cluster.write("a0", env=env, command=command)
    outputs += [cluster.run("plan"), cluster.run("plan", "-o", "json")]
    outputs += [cluster.run("--once", "-v", "-v")]
    for fmt in ("table", "wide", "json", "yaml"):
        outputs.append(cluster.run("status", "-o", fmt))
    outputs += [cluster.run("describe", "a0"), cluster.run("logs", "a0")]
    outputs += [cluster.run("devices"), cluster.run("down", "-v")]
    shown = "\n".join(r.out + r.err for r in outputs)
    assert "visible-value" in shown, "the redaction test saw no env at all"
    leaks = sorted({s for s in (*SECRETS.values(), "s3cr3t-changed", "s3cr3t-arg") if s in shown})
    assert leaks == [], f"secrets shown: {leaks}"
    journal = "".join(p.read_text() for p in (cluster.state / "events").glob("*.jsonl"))
    assert "s3cr3t" not in journal


def test_secrets_never_in_daemon_logs(cluster: Cluster) -> None:
    cluster.write("a0", env=dict(SECRETS), command=[*cluster.manifest("x")["spec"]["command"]])
    proc = subprocess.Popen(
        cluster.argv("-v", "-v", "--resync", "0.2s"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=cluster.env,
        start_new_session=True,
    )
    cluster.helpers.append(proc)
    try:
        import time

        deadline = time.monotonic() + 30
        while "a0" not in read_records(cluster.state)[0] and time.monotonic() < deadline:
            time.sleep(0.1)
        cluster.remove("a0")
        time.sleep(1.0)
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0].decode(errors="replace")
    assert "a0" in out, out[-2000:]
    assert not [s for s in SECRETS.values() if s in out], out[-2000:]
