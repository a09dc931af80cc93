"""``export`` of a deployment with ``spec.source``: an initContainer that downloads into a
volume the engine shares, valid by ``kubernetes-validate --strict``; and the
initContainer's own program run for real here against the local servers (curl for a
URL, with its resume and its digest check; the hub client for a repo)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubelet_expand import container_argv
from modelservers import HubServer, serving
from strategies import deployment
from test_export import VERSIONS, by_kind

from controller.core.kubernetes import exportpull
from controller.core.kubernetes.export import export
from controller.core.manifest.specs import Deployment

MB = 1 << 20
DATA = os.urandom(2 * MB + 99)
DIGEST = hashlib.sha256(DATA).hexdigest()
URL = "https://models.example.org/tiny.gguf"
HUB = {"huggingFace": {"repo": "acme/tiny", "files": ["*q4_k_m.gguf"]}}
ENV_FILE = [{"file": "/etc/reconcile/hf.env"}]


def llama(source: dict[str, Any], **spec: Any) -> Deployment:
    return deployment("tiny", engine="llama-cpp", command=None, source=source, **spec)


def pod(dep: Deployment) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(export(dep))["Deployment"]["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    "dep",
    [
        llama({"url": URL, "sha256": DIGEST}),
        llama(HUB, env={"HF_ENDPOINT": "https://hub.example.org"}),
        llama({"url": URL, "sha256": DIGEST}, devices={"count": 1, "kind": "nvidia"}),
        llama(HUB, restartPolicy="Never"),  # a Job's pod
    ],
    ids=["url", "hub", "url-gpu", "hub-job"],
)
def test_a_source_exports_valid_objects(dep: Deployment, version: str) -> None:
    for obj in export(dep).objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_engine_waits_for_the_pull_and_reads_the_shared_volume() -> None:
    spec = pod(llama({"url": URL, "sha256": DIGEST}, devices={"count": 1, "kind": "nvidia"}))
    (init,) = spec["initContainers"]
    (engine,) = spec["containers"]
    assert init["name"] == "pull-model" and init["image"] == exportpull.CURL_IMAGE
    assert init["volumeMounts"] == [{"name": "models", "mountPath": "/models"}]
    assert {"name": "models", "mountPath": "/models"} in engine["volumeMounts"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in engine["volumeMounts"]
    assert {v["name"] for v in spec["volumes"]} == {"dshm", "models"}
    assert engine["args"][:2] == ["-m", "/models/tiny.gguf"]  # {model}: the pulled file
    assert init["args"][-3:] == [URL, "tiny.gguf", DIGEST]  # user values: arguments only


def test_a_hub_source_passes_its_settings_and_an_optional_token() -> None:
    spec = pod(llama(HUB, env={"HF_ENDPOINT": "https://hub.example.org", "OTHER": "x"}))
    (init,) = spec["initContainers"]
    env = {e["name"]: e for e in init["env"]}
    assert env["HF_ENDPOINT"]["value"] == "https://hub.example.org" and "OTHER" not in env
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "hf-token",
        "key": "token",
        "optional": True,
    }
    assert init["args"][1:] == ["/models", "acme/tiny", "main", "*q4_k_m.gguf"]
    assert spec["containers"][0]["args"][:2] == ["-m", "/models/model"]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_hub_pull_reads_the_engines_env_from_secret(version: str) -> None:
    """A gated repo's HF_TOKEN in the envFrom files reaches the engine through the
    deployment's Secret; the download before it reads the same Secret (it read only the
    optional hf-token, so the pull of a gated repo failed on the cluster). No env entry
    named HF_TOKEN is left to shadow it (an env entry beats envFrom)."""
    dep = llama(HUB, env={"HF_ENDPOINT": "https://hub.example.org"}, envFrom=ENV_FILE)
    exported = export(dep)
    spec = by_kind(exported)["Deployment"]["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    (engine,) = spec["containers"]
    assert init["envFrom"] == engine["envFrom"] == [{"secretRef": {"name": "tiny-env"}}]
    assert init["env"] == [{"name": "HF_ENDPOINT", "value": "https://hub.example.org"}]
    notes = {n.field: n.message for n in exported.notes}
    assert "reads the Secret tiny-env as the engine does" in notes[("spec", "source")]
    assert "hf-token" not in notes[("spec", "source")]
    for obj in exported.objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_a_url_pull_needs_no_secret() -> None:
    (init,) = pod(llama({"url": URL, "sha256": DIGEST}, envFrom=ENV_FILE))["initContainers"]
    assert "envFrom" not in init and "env" not in init


def test_a_urls_password_and_token_stay_out_of_the_export_and_its_pods_log(
    tmp_path: Path,
) -> None:
    """A trial exported `https://user:pw@host/tiny.gguf?token=...` in clear in the
    initContainer's args (anyone who may read the Deployment reads it) and its log line.
    The pod reads it from the Secret tiny-source (key url); the args and messages show it
    redacted. Run here with curl, the Secret's file given as the pod would get it."""
    with serving({"tiny.gguf": DATA}, auth="puller:hunter2") as server:
        url = server.url("tiny.gguf").replace("://", "://puller:hunter2@") + "?token=tok999"
        exported = export(llama({"url": url, "sha256": DIGEST}))
        text = repr([exported.objects, [n.message for n in exported.notes]])
        assert "hunter2" not in text and "tok999" not in text
        (init,) = pod(llama({"url": url, "sha256": DIGEST}))["initContainers"]
        (variable,) = init["env"]
        assert variable == {
            "name": "SOURCE_URL",
            "valueFrom": {"secretKeyRef": {"name": "tiny-source", "key": "url"}},
        }
        (note,) = exported.notes
        assert "--from-file=url=FILE" in note.message and "tiny-source" in note.message
        done = run_init(init, tmp_path, SOURCE_URL=url + "\n")  # a file's newline
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "tiny.gguf").read_bytes() == DATA
        assert "hunter2" not in done.stdout + done.stderr and "<redacted>" in done.stdout
    for obj in exported.objects:
        kubernetes_validate.validate(obj, VERSIONS[-1], strict=True)


def test_export_says_how_the_pull_runs() -> None:
    (note,) = export(llama(HUB)).notes
    assert note.field == ("spec", "source")
    assert "emptyDir" in note.message and "hf-token" in note.message


def test_no_source_no_init_container() -> None:
    spec = pod(deployment("tiny", engine="llama-cpp", command=None, model="/m/tiny.gguf"))
    assert "initContainers" not in spec and "volumes" not in spec


# -- the initContainer's program, run here ----------------------------------------------


def run_init(init: dict[str, Any], folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The container's command and args as the kubelet passes them (``$$`` read as ``$``),
    its volume at ``folder`` instead of /models."""
    argv = [str(folder) if a == exportpull.MOUNT else a for a in container_argv(init)]
    if argv[0] == "python3":
        argv[0] = sys.executable
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def url_init(url: str, digest: str = DIGEST) -> dict[str, Any]:
    init: dict[str, Any] = pod(llama({"url": url, "sha256": digest}))["initContainers"][0]
    return init


def test_the_url_init_container_downloads_and_checks(tmp_path: Path) -> None:
    with serving({"tiny.gguf": DATA}) as server:
        init = url_init(server.url("tiny.gguf"))
        done = run_init(init, tmp_path)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "tiny.gguf").read_bytes() == DATA
        again = run_init(init, tmp_path)  # a restarted pod's initContainer: nothing to do
        assert again.returncode == 0 and server.requests == 1


def test_a_sources_dollars_reach_the_pull_as_written() -> None:
    """The kubelet reads `$$` as `$` and expands `$(VAR)`: the script's own `$(cmd)` and
    the user's values reach sh as written all the same."""
    url = "https://models.example/$(SOURCE_URL)/a$$b.gguf"
    argv = container_argv(url_init(url))
    assert argv[:6] == ["sh", "-c", exportpull.URL_SCRIPT, exportpull.CONTAINER,
                        exportpull.MOUNT, url]  # fmt: skip
    assert argv[-1] == DIGEST


def test_the_url_init_container_discards_a_wrong_digest(tmp_path: Path) -> None:
    with serving({"tiny.gguf": DATA}) as server:
        done = run_init(url_init(server.url("tiny.gguf"), "0" * 64), tmp_path)
    assert done.returncode == 1
    assert DIGEST in done.stderr and "0" * 64 in done.stderr
    assert not list(tmp_path.iterdir())  # neither the file nor the partial


def test_the_url_init_container_resumes_a_cut_download(tmp_path: Path) -> None:
    with serving({"tiny.gguf": DATA}, cut_after=MB) as server:
        init = url_init(server.url("tiny.gguf"))
        first = run_init(init, tmp_path)  # the cut: curl fails, the partial file stays
        assert first.returncode != 0
        assert (tmp_path / "tiny.gguf.partial").stat().st_size >= MB
        second = run_init(init, tmp_path)  # Kubernetes restarts the initContainer
        assert second.returncode == 0, second.stderr
        assert server.ranges and server.ranges[-1].startswith("bytes=")
        assert server.sent - len(DATA) <= MB  # resumed, not downloaded again
    assert (tmp_path / "tiny.gguf").read_bytes() == DATA


def test_the_hub_init_container_links_the_chosen_file(tmp_path: Path) -> None:
    files = {"model-q4_k_m.gguf": os.urandom(MB), "model-f16.gguf": b"x" * 10}
    with HubServer("acme/tiny", files) as hub:
        init = pod(llama(HUB))["initContainers"][0]
        done = run_init(init, tmp_path, HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf"))
        assert done.returncode == 0, done.stderr
        assert hub.downloads == ["model-q4_k_m.gguf"]
    link = tmp_path / "model"
    assert link.is_symlink() and os.readlink(link) == "files/model-q4_k_m.gguf"
    assert link.read_bytes() == files["model-q4_k_m.gguf"]
