"""A fleet from one repository: three daemons (three state dirs, node names, label sets,
device inventories) follow ONE bare repository over file://; each runs exactly the
deployments whose spec.nodeSelector its node.yaml labels match, and a label change moves
a deployment from one node to another, never twice on one node. DESIGN.md "A fleet from
one repository". The scenario's steps are tests/git/fleet.py's, which
tests/cluster/test_fleet_hosts.py runs on namespace hosts at their own addresses."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.git.conftest import Remote
from tests.git.fleet import (
    Node,
    close_fleet,
    each_runs_its_share,
    make_fleet,
    manifests,
    mover_leaves_a,
    mover_reaches_b,
    stop_all,
)


@pytest.fixture
def fleet(tmp_path: Path, remote: Remote) -> Iterator[dict[str, Node]]:
    nodes = make_fleet(tmp_path, remote.url)
    yield nodes
    close_fleet(nodes, remote.url)


def test_three_nodes_each_run_their_share_and_a_label_change_moves_one(
    reconcile: Any, remote: Remote, fleet: dict[str, Node]
) -> None:
    remote.commit(manifests(reconcile), "a fleet of four deployments")
    each_runs_its_share(fleet)
    # `plan` on a node says what it left to the others, and why.
    c = fleet["c"].rc  # no -f: the state dir remembers the repository it follows
    mine = ("--state-dir", str(c.state), "--node", c.node, "--devices", c.devices)
    said = c("plan", *mine, common=False, check=0).out
    assert "3 deployments skipped: nodeSelector gpu=a10; gpu=h100; pool=batch" in said, said
    table = c("status", check=0).out  # and so does `status`, above its table
    assert "3 deployments skipped: nodeSelector gpu=a10; gpu=h100; pool=batch" in table, table
    # ... even without the daemon's --node (the host's name then): the state dir is c's
    bare = c("--state-dir", str(c.state), "status", common=False, check=0).out
    assert "3 deployments skipped: nodeSelector gpu=a10; gpu=h100; pool=batch" in bare, bare
    assert "do not match this node's labels" in said, said

    # `mover` goes from a to b: a loses pool=batch ...
    mover_leaves_a(reconcile, fleet)
    b = fleet["b"]
    # ... a node.yaml that cannot be read stops nothing: the daemon keeps the last good
    # labels and says so ...
    small = b.engines("small")
    (b.rc.state / "node.yaml").write_text("labels: {pool: [batch]}\n")
    b.reload()
    failed = b.wait(
        lambda: [x for x in b.daemon.lines() if x.get("event", "").startswith("reload failed")],
        "the reload refused",
    )
    assert "node.yaml:1: labels" in failed[0]["error"], failed
    assert b.running() == {"small": "Ready"} and b.engines("small") == small
    # ... and b gains pool=batch: it starts mover once, beside small; a runs it no more.
    mover_reaches_b(fleet, small)
    stop_all(fleet)


def test_with_folders_a_label_change_prunes_and_an_unreadable_node_yaml_stops_nothing(
    reconcile: Any,
) -> None:
    node_yaml = reconcile.state / "node.yaml"
    reconcile.state.mkdir(mode=0o700)
    node_yaml.write_text("labels: {gpu: h100}\n")
    reconcile.write("big", nodeSelector={"gpu": "h100"})
    reconcile.write("other", nodeSelector={"gpu": "a10"})
    out = reconcile.once()
    note = "1 deployment skipped: nodeSelector gpu=a10 does not match this node's labels"
    assert note in out.out, out
    assert set(reconcile.status(cli=True)) == {"big"}  # no row for the other node's
    assert note in reconcile("status", check=0).out
    planned = reconcile("plan", "-o", "json", check=0).json()
    assert planned["skipped"] == {"other": "gpu=a10"} and planned["changes"] == [], planned
    (pid,) = reconcile.pids("big")

    node_yaml.write_text("labels: {gpu: h100\n")  # half-written: the pass is refused
    out = reconcile.once(check=1)
    assert f"{node_yaml}:" in out.err and "Traceback" not in out.err, out
    # `plan` goes on, says it once, would stop nothing, and exits 1 as `--once` does
    plan = reconcile("plan", check=1)
    assert f"error: {node_yaml}:2: invalid YAML" in plan.out and plan.err == "", plan
    assert "`--once` refuses to run on it" in plan.out and "In sync" not in plan.out, plan
    assert "skipped: this node's labels could not be read" in plan.out, plan
    assert "destroy" not in plan.out.replace("0 to destroy", ""), plan
    assert reconcile.pids("big") == {pid} and reconcile.record("big") is not None

    node_yaml.write_text("labels: {gpu: a10}\n")  # relabelled: big goes, other comes
    out = reconcile.once()
    assert "nodeSelector gpu=h100 does not match" in out.out, out
    assert not reconcile.alive(pid) and reconcile.record("big") is None
    (stopped,) = [e for e in reconcile.events("big") if e.get("action") == "stop"]
    assert stopped["reason"] == "nodeSelector gpu=h100 no longer matches this node's labels"
    assert set(reconcile.status()) == {"other"} and reconcile.pids("other")
    reconcile.down()


def test_a_node_yaml_emptied_by_a_write_in_progress_stops_nothing(reconcile: Any) -> None:
    """A node.yaml of no byte (`cat > node.yaml` at the instant of its truncate, an editor's
    save cut short, a full disk) was read as no settings: the node's labels gone, a
    `--once` stopped every deployment they selected ("no longer matches this node's
    labels"). It is refused as a half-written one is, naming the file and the next move;
    a comment alone says a node has no settings, and then the selected one goes."""
    node_yaml = reconcile.state / "node.yaml"
    reconcile.state.mkdir(mode=0o700)
    node_yaml.write_text("labels: {gpu: h100}\n")
    reconcile.write("big", nodeSelector={"gpu": "h100"})
    reconcile.once()
    (pid,) = reconcile.pids("big")
    for emptied in ("", " \n\n"):
        node_yaml.write_text(emptied)
        out = reconcile.once(check=1)
        assert f"{node_yaml}: is empty (a write cut short" in out.err, out
        assert "Traceback" not in out.err, out
        assert reconcile.pids("big") == {pid} and reconcile.record("big") is not None, out
    node_yaml.write_text("# no settings\n")  # said so: no labels, so big is not this node's
    out = reconcile.once()
    assert "nodeSelector gpu=h100 does not match" in out.out, out
    assert not reconcile.alive(pid) and reconcile.record("big") is None, out
    reconcile.down()


def test_a_once_wait_says_what_it_skipped_as_a_once_does(reconcile: Any) -> None:
    """A README trial: `--once --wait` on a fleet node said nothing of the deployments it
    left to other nodes, where `--once`, `plan` and `status` say how many and why."""
    reconcile.state.mkdir(mode=0o700)
    (reconcile.state / "node.yaml").write_text("labels: {gpu: h100}\n")
    reconcile.write("big", nodeSelector={"gpu": "h100"})
    reconcile.write("other", nodeSelector={"gpu": "a10"})
    out = reconcile.converge()
    note = "1 deployment skipped: nodeSelector gpu=a10 does not match this node's labels"
    assert note in out.out, out
    assert set(reconcile.status()) == {"big"}
    reconcile.down()


def test_a_broken_manifest_for_other_nodes_is_an_error_but_no_record_here(
    reconcile: Any,
) -> None:
    reconcile.state.mkdir(mode=0o700)
    (reconcile.state / "node.yaml").write_text("labels: {gpu: h100}\n")
    reconcile.write("mine", nodeSelector={"gpu": "h100"}, bogus=1)
    reconcile.write("theirs", nodeSelector={"gpu": "a10"}, bogus=1)
    out = reconcile.once(check=1)  # the repository holds errors: each is said
    assert "mine.yaml" in out.err and "theirs.yaml" in out.err, out
    assert "1 deployment skipped: nodeSelector gpu=a10" in out.out, out
    assert set(reconcile.status()) == {"mine"}  # invalid here: Pending, named
    assert reconcile.record("theirs") is None  # another node's to refuse


def test_a_typo_in_a_commit_that_also_moves_a_deployment_away_stops_nothing(
    reconcile: Any,
) -> None:
    """Invariant 4 over a selector: a manifest that does not load moves nothing, even
    when the selector it can still be read for names another node (that node refuses the
    broken manifest too: stopping it here would leave it running nowhere)."""
    reconcile.state.mkdir(mode=0o700)
    (reconcile.state / "node.yaml").write_text("labels: {gpu: h100}\n")
    reconcile.write("big", nodeSelector={"gpu": "h100"})
    reconcile.converge()
    (pid,) = reconcile.pids("big")

    reconcile.write("big", nodeSelector={"gpu": "a10"}, bogus=1)  # moved away, and a typo
    out = reconcile.once(check=1)
    assert "big.yaml" in out.err and "bogus" in out.err, out
    assert reconcile.alive(pid) and reconcile.pids("big") == {pid}, out
    rec = reconcile.record("big")
    assert rec is not None and rec["spec_valid"] is False, rec
    assert "engine left running" in rec["message"] and "bogus" in rec["message"], rec
    assert not [e for e in reconcile.events("big") if e.get("action") == "stop"]

    reconcile.write("big", nodeSelector={"gpu": "a10"})  # fixed: the move goes ahead
    out = reconcile.once()
    assert not reconcile.alive(pid) and reconcile.record("big") is None, out
    (stopped,) = [e for e in reconcile.events("big") if e.get("action") == "stop"]
    assert stopped["reason"] == "nodeSelector gpu=a10 no longer matches this node's labels"


def test_a_broken_manifest_whose_engine_runs_here_is_said_kept_not_skipped(
    reconcile: Any,
) -> None:
    """`status`'s "N skipped" line counted a manifest that did not load and whose selector
    names other nodes while this node ran its engine on (invariant 4): the line said it ran
    nowhere here. It counts what it says, and the kept one is said as such (plan and
    --once too)."""
    reconcile.state.mkdir(mode=0o700)
    (reconcile.state / "node.yaml").write_text("labels: {gpu: h100}\n")
    reconcile.write("big", nodeSelector={"gpu": "h100"})
    reconcile.write("other", nodeSelector={"gpu": "a10"})
    reconcile.converge()
    (pid,) = reconcile.pids("big")
    node_yaml = reconcile.state / "node.yaml"
    node_yaml.write_text("labels: {gpu: a10}\n")  # relabelled: big, valid, is to go
    plan = reconcile("plan", check=None)
    assert "1 deployment skipped: nodeSelector gpu=h100" in plan.out, plan
    assert "kept here" not in plan.out, plan  # a valid one going is no kept invalid one
    node_yaml.write_text("labels: {gpu: h100}\n")
    reconcile.write("big", nodeSelector={"gpu": "a10"}, bogus=1)  # moved away, and a typo

    skipped = "1 deployment skipped: nodeSelector gpu=a10 does not match this node's labels"
    kept = "1 deployment kept here with its spec invalid: big (nothing is moved until"
    out = reconcile.once(check=1)
    assert skipped in out.out and kept in out.out, out
    status = reconcile("status", check=0).out
    assert skipped in status and kept in status and "2 deployments" not in status, status
    plan = reconcile("plan", check=None)
    assert skipped in plan.out and kept in plan.out and "2 deployments" not in plan.out, plan
    planned = reconcile("plan", "-o", "json", check=None).json()
    assert (planned["skipped"], planned["kept_invalid"]) == ({"other": "gpu=a10"}, ["big"])
    assert reconcile.alive(pid) and reconcile.pids("big") == {pid}
    reconcile.down()


def test_one_name_for_two_node_classes_is_a_duplicate_only_where_both_are_selected(
    reconcile: Any,
) -> None:
    """`chat` declared for gpu=a100 nodes and again for gpu=h100 nodes was refused as a
    duplicate on every node, though a node reads only the deployments its labels select
    (a Kubernetes name is unique within its namespace alone). A node runs the one it
    selects; one whose labels select both says the duplicate, with both files and lines."""
    reconcile.state.mkdir(mode=0o700)
    node_yaml = reconcile.state / "node.yaml"
    node_yaml.write_text("labels: {gpu: h100, site: lab}\n")
    for file, selector in (("chat-a100", {"gpu": "a100"}), ("chat-h100", {"gpu": "h100"})):
        spec = reconcile.deployment("chat", nodeSelector=selector, basePort=reconcile.port)
        reconcile.write_text(f"{file}.yaml", reconcile.dump_yaml(spec))
    out = reconcile.once()
    assert "duplicate" not in out.err, out
    rec = reconcile.record("chat")
    assert rec is not None and rec["source"].endswith("chat-h100.yaml"), rec
    (pid,) = reconcile.pids("chat")
    plan = reconcile("plan", check=0)
    assert "duplicate" not in plan.out + plan.err, plan
    valid = reconcile("validate", check=0)  # the fleet's view: no node selects both
    assert "2 deployment(s) in 2 file(s): valid" in valid.out, valid

    lab = reconcile.deployment("chat", nodeSelector={"site": "lab"}, basePort=reconcile.port)
    reconcile.write_text("chat-lab.yaml", reconcile.dump_yaml(lab))  # this node selects both
    out = reconcile.once(check=1)
    said = [ln for ln in out.err.splitlines() if ln.startswith("error: ")]
    assert len(said) == 2, out
    assert all("duplicate deployment name 'chat'" in ln for ln in said), out
    assert all("chat-h100.yaml:" in ln and "chat-lab.yaml:" in ln for ln in said), out
    assert not any("chat-a100.yaml" in ln for ln in said), out  # not this node's
    assert reconcile.alive(pid) and reconcile.pids("chat") == {pid}, out  # invariant 4
    valid = reconcile("validate", check=1)  # a node labelled gpu=a100,site=lab would refuse
    assert "chat-lab.yaml" in valid.err and "duplicate deployment name 'chat'" in valid.err
    reconcile.down()


def test_a_cron_once_beside_a_daemon_not_reloaded_after_a_relabel_changes_nothing(
    reconcile: Any, remote: Remote, git_daemon: Any
) -> None:
    """node.yaml relabelled, the daemon not reloaded yet: a cron `--once` beside it stopped
    what the new labels leave to other nodes, and the daemon's next pass (its labels the
    old ones) started it again, at every cron run. The run is refused, naming both label
    sets and the reload; the reload moves it, once."""
    reconcile.state.mkdir(mode=0o700)
    node_yaml = reconcile.state / "node.yaml"
    node_yaml.write_text("labels: {gpu: a10}\n")
    remote.deploy("small", nodeSelector={"gpu": "a10"})
    git = ("--git", remote.url, "--git-path", "manifests")
    d = git_daemon(*git, "--interval", "1h")
    d.wait(lambda: (reconcile.record("small") or {}).get("phase") == "Ready", "small Ready")
    (pid,) = reconcile.pids("small")

    node_yaml.write_text("labels: {gpu: h100}\n")  # no reload yet
    out = reconcile("--once", *git, check=1)
    said = "node.yaml's labels (gpu=h100) are not those the daemon (pid"
    assert said in out.err and "runs with (gpu=a10)" in out.err, out
    assert f"kill -HUP {d.proc.pid}" in out.err, out
    assert reconcile.pids("small") == {pid} and reconcile.record("small")["ref"]["pid"] == pid

    d.proc.send_signal(signal.SIGHUP)
    d.wait(lambda: reconcile.record("small") is None, "small stopped at the reload")
    assert not reconcile.alive(pid)
    out = reconcile("--once", *git, check=0)  # the daemon's labels now: it runs
    assert "1 deployment skipped: nodeSelector gpu=a10" in out.out, out
    assert d.stop() == 0
    reconcile(*git, "down", check=0)
