"""What a person sees of pulls: status's progress (text and JSON), ``reconcile models``
and ``models prune``, which keeps what any manifest names and, with an empty or broken
manifests folder, removes nothing."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from modelservers import serving
from procs import kill_marked

from controller.core.pulls import size_text
from controller.pull import launch
from controller.store.models.modelcache import CacheEntry

MB = 1 << 20
KEPT, GONE = os.urandom(MB), os.urandom(MB // 2)


def key(data: bytes) -> str:
    return f"sha256-{hashlib.sha256(data).hexdigest()}"


@pytest.fixture
def cache(reconcile: Any) -> Iterator[Path]:
    root = reconcile.state / "models"
    yield root
    left = kill_marked(str(root), marker=launch.MARKER)
    assert not left, f"pull processes left running: {left}"


def source(server: Any, name: str, data: bytes) -> dict[str, str]:
    return {"url": server.url(name), "sha256": hashlib.sha256(data).hexdigest()}


def test_status_shows_the_pull_as_it_goes(reconcile: Any, cache: Path) -> None:
    with serving({"kept.gguf": KEPT}, hold=MB // 2) as server:
        reconcile.write("web", source=source(server, "kept.gguf", KEPT))
        reconcile.once()
        entry = CacheEntry.of(cache, key(KEPT))
        reconcile.wait_for(lambda: (p := entry.progress()) and p.bytes_total, what="progress")
        (item,) = reconcile("status", "-o", "json", check=0).json()
        assert item["phase"] == "Pulling" and item["devices"] == [] and item["port"] is None
        assert item["pull"]["bytes_total"] == MB
        assert set(item["pull"]) == {"bytes_done", "bytes_total", "rate"}
        table = reconcile("status", check=0).out
        assert "Pulling" in table and "/1.0 MB" in table
        server.release()
        reconcile.wait_for(lambda: entry.model_path(), what="the pull")
    reconcile.down()


def test_a_pull_killed_shows_no_rate_eta_or_pid_until_a_pass_resumes_it(
    reconcile: Any, cache: Path
) -> None:
    """progress.json keeps the dead pull's last figure: status and describe showed its
    rate, an ETA counting down and its pid as if it ran (until cron's next pass)."""
    with serving({"kept.gguf": KEPT}, hold=MB // 2) as server:
        reconcile.write("web", source=source(server, "kept.gguf", KEPT))
        reconcile.once()
        entry = CacheEntry.of(cache, key(KEPT))
        reconcile.wait_for(lambda: (p := entry.progress()) and p.rate > 0, what="a rate")
        assert kill_marked(str(cache), marker=launch.MARKER)
        reconcile.wait_for(lambda: not entry.busy(), what="the lock to go with the process")
        (item,) = reconcile("status", "-o", "json", check=0).json()
        assert item["pull"]["rate"] == 0 and item["pull"]["bytes_done"] > 0
        assert "/s" not in item["message"] and "ETA" not in item["message"]
        (pull,) = [ln for ln in reconcile("describe", "web").out.splitlines() if "Pull:" in ln]
        assert "/s" not in pull and "ETA" not in pull and "pid" not in pull, pull
        server.release()
        reconcile.converge()  # the next pass resumes it
    reconcile.down()


def test_models_lists_and_prune_keeps_what_a_manifest_names(reconcile: Any, cache: Path) -> None:
    with serving({"kept.gguf": KEPT, "gone.gguf": GONE}) as server:
        reconcile.write("keep", source=source(server, "kept.gguf", KEPT))
        reconcile.write("drop", source=source(server, "gone.gguf", GONE))
        planned = reconcile("plan", check=None).out
        reconcile.converge()
    listing = reconcile("models", check=0).out
    assert "kept.gguf" in listing and "gone.gguf" in listing and "keep" in listing
    # SIZE is the model's bytes, as plan's (the cache's notes beside it counted: 524.6 kB)
    (row,) = [ln for ln in listing.splitlines() if "gone.gguf" in ln]
    assert f" {size_text(len(GONE))} " in row and size_text(len(GONE)) in planned, (row, planned)
    reconcile.down()  # no record names either file now; the manifests still do
    (reconcile.manifests / "drop.yaml").unlink()

    dry = reconcile("models", "prune", "--dry-run", check=0).out
    assert key(GONE) in dry and key(KEPT) not in dry
    assert (cache / key(GONE)).exists()  # a dry run removes nothing

    reconcile("models", "prune", check=0)
    assert (cache / key(KEPT)).exists() and not (cache / key(GONE)).exists()
    for again in (("--dry-run",), ()):  # nothing left to prune: said, not silent
        out = reconcile("models", "prune", *again, check=0).out
        assert out == f"No unused models in {cache}: nothing to prune.\n", out


def test_prune_keeps_the_model_of_each_node_class_of_one_name(reconcile: Any, cache: Path) -> None:
    """`chat` declared for gpu=a100 and again for gpu=h100 nodes, each with its model:
    `models prune` refused the pair as a duplicate (nothing removed, exit 1), though each
    node runs its own; it keeps both models, as any manifest's, and removes the rest."""
    reconcile.state.mkdir(mode=0o700, exist_ok=True)
    node_yaml = reconcile.state / "node.yaml"
    other = os.urandom(MB // 4)
    files = {"kept.gguf": KEPT, "other.gguf": other, "gone.gguf": GONE}
    with serving(files) as server:
        for gpu, name in (("a100", "kept.gguf"), ("h100", "other.gguf")):
            doc = reconcile.deployment(
                "chat", nodeSelector={"gpu": gpu}, source=source(server, name, files[name]),
                basePort=reconcile.port,
            )  # fmt: skip
            reconcile.write_text(f"chat-{gpu}.yaml", reconcile.dump_yaml(doc))
        reconcile.write("drop", source=source(server, "gone.gguf", GONE))
        for gpu in ("a100", "h100"):  # this node serves each class in turn: both pulled
            node_yaml.write_text(f"labels: {{gpu: {gpu}}}\n")
            reconcile.converge()
    reconcile.down()
    (reconcile.manifests / "drop.yaml").unlink()
    assert all((cache / key(data)).exists() for data in files.values())

    reconcile("models", "prune", check=0)
    assert (cache / key(KEPT)).exists() and (cache / key(other)).exists()
    assert not (cache / key(GONE)).exists()


def test_models_names_deployments_not_their_replicas(reconcile: Any, cache: Path) -> None:
    """Its DEPLOYMENTS column read `llama,llama@1` for one deployment of two replicas (a
    trial): `llama@1` is no deployment's name."""
    with serving({"kept.gguf": KEPT}) as server:
        reconcile.write("keep", source=source(server, "kept.gguf", KEPT), replicas=2)
        reconcile.converge()
    assert set(reconcile.status()) == {"keep", "keep@1"}
    (row,) = [ln for ln in reconcile("models", check=0).out.splitlines() if "kept.gguf" in ln]
    assert row.split()[-1] == "keep", row
    reconcile.down()


def test_models_names_the_deployments_whose_manifests_name_the_file(
    reconcile: Any, cache: Path
) -> None:
    """Its DEPLOYMENTS column read the records and the engines' past uses (used.json):
    after `down`, a file that a manifest names but no engine started on read "-", which
    `models prune` keeps, and a file no manifest names any more read its old user, which
    prune removes. It names what prune keeps it for: the manifests' deployments and the
    records'."""

    def column() -> str:
        (row,) = [ln for ln in reconcile("models", check=0).out.splitlines() if "kept.gguf" in ln]
        return row.split()[-1]

    with serving({"kept.gguf": KEPT}) as server:
        reconcile.write("keep", source=source(server, "kept.gguf", KEPT))
        reconcile.converge()
        reconcile.down()
        assert not reconcile.status()  # no record names it now
        reconcile.write("also", source=source(server, "kept.gguf", KEPT))  # no pass since
    assert column() == "also,keep"
    for name in ("also", "keep"):
        (reconcile.manifests / f"{name}.yaml").unlink()
    assert column() == "-"  # no manifest, no record: what prune removes


def test_prune_says_it_keeps_a_pull_no_manifest_names_any_more(reconcile: Any, cache: Path) -> None:
    """The manifest deleted mid-pull: the pull goes on (as after `down`), and prune,
    which leaves an entry being filled alone, says so instead of nothing at exit 0."""
    with serving({"gone.gguf": GONE}, hold=MB // 4) as server:
        reconcile.write("drop", source=source(server, "gone.gguf", GONE))
        reconcile.write("other")
        reconcile.once()
        entry = CacheEntry.of(cache, key(GONE))
        reconcile.wait_for(lambda: (p := entry.progress()) and p.bytes_done, what="bytes")
        (reconcile.manifests / "drop.yaml").unlink()
        reconcile.once()  # its record is pruned; the pull goes on
        for args in (("--dry-run",), ()):
            said = reconcile("models", "prune", *args, check=0).out
            assert f"kept {entry.folder}" in said and "a pull is filling it" in said, said
        assert entry.folder.exists()
        server.release()
        reconcile.wait_for(lambda: not entry.busy(), what="the pull to end")
    assert f"removed {entry.folder}" in reconcile("models", "prune", check=0).out
    reconcile.down()


@pytest.mark.parametrize("folder", ["empty", "broken"])
def test_prune_removes_nothing_without_a_sound_manifest_folder(
    reconcile: Any, cache: Path, folder: str
) -> None:
    with serving({"kept.gguf": KEPT}) as server:
        reconcile.write("web", source=source(server, "kept.gguf", KEPT))
        reconcile.converge()
    reconcile.down()
    (reconcile.manifests / "web.yaml").unlink()
    if folder == "broken":
        reconcile.write_text("bad.yaml", "apiVersion: reconcile/v1\nkind: [")
    result = reconcile("models", "prune", check=1)
    assert "nothing removed" in result.err
    if folder == "empty":  # in the words validate, plan and --once use
        assert f"nothing removed: no manifest in {reconcile.manifests} (it is empty)" in result.err
    else:  # which file, where (a README trial: it said only "a manifest failed to load")
        said = reconcile("validate", check=1).err.splitlines()[0]  # validate's very words
        assert said.startswith(f"error: {reconcile.manifests / 'bad.yaml'}:"), said
        assert said in result.err.splitlines(), result
    assert (cache / key(KEPT)).exists()


def test_models_reads_a_garbled_used_file_as_never_used(reconcile: Any, cache: Path) -> None:
    """used.json edited by hand (or written by something else): `models` died with a
    traceback on an entry that is no time; such an entry reads as never used, and the
    next start writes the file whole again."""
    with serving({"kept.gguf": KEPT}) as server:
        reconcile.write("web", source=source(server, "kept.gguf", KEPT))
        reconcile.converge()
    used = CacheEntry.of(cache, key(KEPT)).folder / "used.json"
    for garbled in ('{"web": 5}', '{"web": "done"}', '{"web": "2026-01-01T00:00:00"}'):
        used.write_text(garbled)
        out = reconcile("models", check=0)
        (row,) = [ln for ln in out.out.splitlines() if ln.startswith(key(KEPT)[:19])]
        assert " never " in row and "web" in row, out.out
    reconcile("restart", "web", check=0)
    reconcile.converge()
    row = [ln for ln in reconcile("models").out.splitlines() if ln.startswith(key(KEPT)[:19])]
    assert " ago " in row[0], row
    reconcile.down()


def test_a_lost_result_file_is_proven_by_the_files_hash_not_downloaded_again(
    reconcile: Any, cache: Path
) -> None:
    """result.json torn (or removed) beside a whole file: the next start downloaded the
    model again, all of it (tens of GB for a real one); the file's sha256 is its key, so
    the file is hashed and kept."""
    with serving({"kept.gguf": KEPT}) as server:
        reconcile.write("web", source=source(server, "kept.gguf", KEPT))
        reconcile.converge()
        sent = server.sent
        entry = CacheEntry.of(cache, key(KEPT))
        (entry.folder / "result.json").write_text('{"status": "do')
        reconcile("restart", "web", check=0)
        reconcile.converge()
        assert server.sent == sent, "downloaded again"
        assert entry.model_path() == entry.folder / "kept.gguf"
    reconcile.down()
