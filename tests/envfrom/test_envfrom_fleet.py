"""spec.envFrom in a fleet (DESIGN.md "A fleet from one repository", "Secrets"): each node
decrypts with its own age key, and a deployment's `file` items (and its container's
volumes) live on the nodes its nodeSelector picks. A node that the selector leaves out
read them anyway: it could not (another node's key, a file only that node has), so it
kept a Pending record of a deployment that is not its own, said its source Degraded, and
its `--once` exited 1, on every node of the fleet but the one that runs it. Now a node
reads them for the deployments it runs, and skips the others as any other node's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agekey import AgeKey, make_key


def test_a_node_reads_no_secret_of_a_deployment_its_labels_leave_to_others(
    reconcile: Any, age_key: AgeKey, tmp_path: Path
) -> None:
    rc = reconcile
    rc.state.mkdir(mode=0o700)
    (rc.state / "node.yaml").write_text("labels: {gpu: a10}\n")
    rc.env["SOPS_AGE_KEY_FILE"] = str(age_key.file)  # this node's key
    theirs = make_key(tmp_path / "h100-keys", "h100")  # the H100 node's: not on this one
    theirs.encrypt("HF_TOKEN=for-the-h100-only\n", rc.manifests / "secrets" / "big.env")
    age_key.encrypt("HF_TOKEN=for-this-node\n", rc.manifests / "secrets" / "small.env")
    h100_file = tmp_path / "on-the-h100-only.env"  # a node file this node does not have
    rc.write(
        "big",
        nodeSelector={"gpu": "h100"},
        envFrom=[{"sopsFile": "secrets/big.env"}, {"file": str(h100_file)}],
    )
    h100_models = tmp_path / "h100-models"  # a volume's folder, on the H100 node alone
    volumes = [f"{h100_models}:/models:ro"]
    container = {"image": "localhost/engine:1", "runtime": "podman", "volumes": volumes}
    rc.write("boxed", nodeSelector={"gpu": "h100"}, container=container)
    rc.write("small", nodeSelector={"gpu": "a10"}, envFrom=[{"sopsFile": "secrets/small.env"}])

    done = rc.once()  # exit 0: nothing here is Pending or invalid
    said = "2 deployments skipped: nodeSelector gpu=h100 does not match this node's labels"
    assert said in done.out, done
    assert "big" not in done.err and "envFrom" not in done.err, done
    assert "boxed" not in done.err and "h100-models" not in done.err, done
    assert rc.record("big") is None and rc.record("boxed") is None
    rc.converge()
    assert set(rc.status()) == {"small"} and rc.status()["small"]["phase"] == "Ready"
    plan = rc("plan", check=0)  # in sync, saying nothing of big's files
    assert said in plan.out and "envFrom" not in plan.out + plan.err, plan

    h100_file.write_text("X=1\n")  # the file is there, readable by others: still not ours
    h100_file.chmod(0o644)
    assert "envFrom" not in rc.once().err
    rc.down()
