"""A newcomer's first hour (found in a trial): the quick start's `--once --wait` run from
the wrong folder, and the slips people make writing their first manifest."""

from __future__ import annotations

from typing import Any


def test_wait_exits_1_like_once_when_the_folder_is_missing_or_empty(reconcile: Any) -> None:
    """README's quick start chains `reconcile --once --wait && reconcile status`: from a
    folder without `manifests/` the wait said nothing and exited 0, where `--once` exits 1
    naming the folder, so the chain went on as if the demo were up."""
    rc = reconcile
    missing = rc.tmp / "no-such-folder"
    once = rc("--once", "-f", str(missing), check=1)
    wait = rc("--once", "--wait", "--timeout", "30s", "-f", str(missing), check=1)
    said = f"error: manifests folder {missing} does not exist"
    assert said in once.err and said in wait.err, wait

    empty = rc.tmp / "empty"
    empty.mkdir()
    wait = rc("--once", "--wait", "--timeout", "30s", "-f", str(empty), check=1)
    assert f"no manifest in {empty} (it is empty): nothing pruned" in wait.err, wait

    # the folder emptied under a Ready engine: it runs on unpruned, and the wait says so
    rc.write("web")
    rc.converge()
    (rc.manifests / "web.yaml").unlink()
    wait = rc("--once", "--wait", "--timeout", "30s", check=1)
    assert f"no manifest in {rc.manifests} (it is empty): nothing pruned" in wait.err, wait
    assert rc.record("web")["phase"] == "Ready"
    rc.down()


def test_a_value_or_field_one_slip_away_gets_a_did_you_mean(reconcile: Any) -> None:
    """A first manifest's slips: a field with two letters swapped (`spce`: too short for
    the similarity cutoff) and values in the wrong case or without their dash (`always`,
    `llamacpp`, `Deploymnet`) were named with pydantic's list of allowed values only."""
    rc = reconcile
    rc.write_text(
        "a.yaml",
        "apiVersion: reconcile/v1\nkind: Deploymnet\nmetadata: {name: a}\n"
        "spec:\n  engine: llamacpp\n  model: x\n  restartPolicy: always\n"
        "  devices: {kind: gpu}\n",
    )
    rc.write_text("b.yaml", "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: b}\n"
                  "spce: {engine: command}\n")  # fmt: skip
    err = rc("validate", check=1).err
    a, b = rc.manifests / "a.yaml", rc.manifests / "b.yaml"
    for line in (
        f"{a}:2: kind: Input should be 'Deployment', not 'Deploymnet': did you mean `Deployment`?",
        f"{a}:5: spec.engine: Input should be 'vllm', 'llama-cpp', 'sglang', 'tgi', 'ollama'"
        " or 'command', not 'llamacpp': did you mean `llama-cpp`?",
        f"{a}:7: spec.restartPolicy: Input should be 'Always', 'OnFailure' or 'Never',"
        " not 'always': did you mean `Always`?",
        # nothing close: what was written, without a guess
        f"{a}:8: spec.devices.kind: Input should be 'nvidia', 'amd', 'apple', 'cpu' or 'any',"
        " not 'gpu'\n",
        f"{b}:4: spce: unknown field: did you mean `spec`?",
    ):
        assert f"error: {line}" in err, err
