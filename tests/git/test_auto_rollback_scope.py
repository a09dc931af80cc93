"""autoRollback judges what a commit changed: a deployment it did not touch, failing since
an older commit, rolls nothing back (in-process: the history and the source file only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from strategies import OWNER, record

from controller.reconciler.run import PassResult
from controller.store.sources.git import source as gitsource

GOOD, BAD = "a" * 40, "b" * 40
LONG_AGO = "2026-01-01T00:00:00+00:00"  # past any progressDeadline


def _source(state: Path, deadline: float = 1.0) -> gitsource.GitSource:
    s = gitsource.settings(
        url="file:///nowhere.git", branch="main", tag=None, path=None, interval=None,
        progress_deadline=deadline,
    )  # fmt: skip
    source = gitsource.GitSource(state, s, always_fetch=False)
    (state / "git").mkdir(parents=True, exist_ok=True)
    gitsource.write_status(state, source.status())
    return source


def _history(state: Path, newest_specs: dict[str, str] | None = None) -> None:
    good: dict[str, Any] = {"revision": GOOD, "by": "poll", "applied_at": LONG_AGO}
    good |= {"outcome": "Ready", "specs": {"web": "h1", "batch": "h2"}}
    bad: dict[str, Any] = {"revision": BAD, "by": "poll", "applied_at": LONG_AGO}
    bad |= {"outcome": "Progressing"}
    if newest_specs is not None:
        bad["specs"] = newest_specs
    gitsource.write_history(state, [good, bad])


@pytest.mark.parametrize(
    ("phases", "rolled"),
    [
        # the commit changed web only; batch broke on its own (a crash, not this commit)
        ({"web": "Ready", "batch": "BackOff"}, False),
        # the commit's own change cannot become Ready: back to the last good commit
        ({"web": "BackOff", "batch": "Ready"}, True),
    ],
    ids=["untouched-failing", "changed-failing"],
)
def test_only_what_the_commit_changed_decides(
    tmp_path: Path, phases: dict[str, str], rolled: bool
) -> None:
    source = _source(tmp_path)
    _history(tmp_path)
    said = source.note_outcome(list(phases.items()), {"web": "h1-new", "batch": "h2"})
    assert (said is not None) is rolled, said
    status = gitsource.read_status(tmp_path)
    assert status is not None and status.pinned == (GOOD if rolled else None)
    newest = gitsource.read_history(tmp_path)[-1]
    assert newest["specs"] == {"web": "h1-new", "batch": "h2"}  # kept from its first pass
    assert newest["outcome"] == "Degraded"


def test_a_commit_that_adds_a_failing_deployment_is_rolled_back(tmp_path: Path) -> None:
    source = _source(tmp_path)
    _history(tmp_path)
    phases = [("web", "Ready"), ("batch", "Ready"), ("new", "BackOff")]
    said = source.note_outcome(phases, {"web": "h1", "batch": "h2", "new": "h3"})
    assert said is not None and GOOD[:12] in said, said


def test_a_commit_whose_manifests_do_not_all_load_is_degraded_and_rolled_back(
    tmp_path: Path,
) -> None:
    """Its engines all Ready (those of the broken file keep their last good spec), yet the
    commit is no good commit: Degraded, and rolled back past the deadline."""
    source = _source(tmp_path)
    _history(tmp_path)
    phases = [("web", "Ready"), ("batch", "Ready")]
    said = source.note_outcome(phases, {"web": "h1", "batch": "h2"}, invalid=True)
    assert said is not None and GOOD[:12] in said, said
    assert gitsource.read_history(tmp_path)[-1]["outcome"] == "Degraded"
    assert gitsource.last_good(tmp_path, but=None) == GOOD


def test_an_engine_on_its_old_spec_proves_no_commit_good(tmp_path: Path) -> None:
    """An engine whose change the node's drain holds serves on Ready with the commit
    before's spec: the commit is Progressing (past the deadline rolled back, as the drain's
    Pending was), never recorded good before its new spec ran (a crash of the new spec
    after uncordon then rolled nothing back)."""
    source = _source(tmp_path)
    _history(tmp_path)
    records = {"web": record("web", spec_hash="h1"), "batch": record("batch", spec_hash="h2")}
    result = PassResult(owner=OWNER, records=records, specs={"web": "h1-new", "batch": "h2"})
    assert result.rollout_phases() == [("web", "Progressing"), ("batch", "Ready")]
    said = source.note_outcome(result.rollout_phases(), result.specs)
    assert said is not None and GOOD[:12] in said, said
    assert gitsource.read_history(tmp_path)[-1]["outcome"] == "Progressing"


def test_a_drain_pauses_the_progress_deadline_and_it_counts_again_from_its_end(
    tmp_path: Path,
) -> None:
    """A commit applied on a node then drained past its progressDeadline was rolled back:
    its change waited for the drain (nothing new starts), so a good commit was left. As
    Kubernetes' paused Deployment: no deadline while drained, the whole of it again from
    the drain's end."""
    source = _source(tmp_path, deadline=3600)
    _history(tmp_path)  # the bad commit applied long ago: past the deadline but for the drain
    phases, specs = [("web", "Progressing"), ("batch", "Ready")], {"web": "h1-new", "batch": "h2"}
    for _ in range(2):  # every pass while drained
        assert source.note_outcome(phases, specs, drained=True) is None
        status = gitsource.read_status(tmp_path)
        assert status is not None and status.pinned is None, status
    paused = gitsource.read_history(tmp_path)[-1]
    assert "paused_at" in paused and "resumed_at" not in paused, paused
    assert source.note_outcome(phases, specs) is None  # uncordoned: a whole deadline again
    entries = gitsource.read_history(tmp_path)
    assert "paused_at" not in entries[-1] and entries[-1]["resumed_at"] > LONG_AGO, entries
    entries[-1]["resumed_at"] = LONG_AGO  # the deadline passed since the drain ended
    gitsource.write_history(tmp_path, entries)
    said = source.note_outcome(phases, specs)
    assert said is not None and GOOD[:12] in said, said


def _status(**fields: Any) -> gitsource.SourceStatus:
    base: dict[str, Any] = {"url": "u", "branch": "main", "tag": None, "path": "m"}
    base |= {"interval": 60.0, "owner": "git:u#m", "fetched": BAD, "applied": BAD}
    base |= {"passed_at": BAD}  # the pass that moved to it has ended
    return gitsource.SourceStatus(**(base | fields))


@pytest.mark.parametrize(
    ("fields", "state"),
    [
        ({}, "Synced"),
        ({"invalid": ["m/a.yaml:3: invalid YAML"], "invalid_at": BAD}, "Degraded"),
        # read at the commit before: the pass at this one has not ended (nor said)
        (
            {"invalid": ["m/a.yaml:3: invalid YAML"], "invalid_at": GOOD, "passed_at": GOOD},
            "Progressing",
        ),
        ({"invalid": ["x"], "invalid_at": BAD, "fetched": GOOD}, "Progressing"),
        ({"invalid": ["x"], "invalid_at": BAD, "fetch_error": "gone"}, "PullFailed"),
        ({"passed_at": None}, "Progressing"),  # moved, its records maybe not yet written
    ],
    ids=["valid", "invalid-here", "invalid-before", "applying", "pull-failed", "not-passed"],
)
def test_the_state_names_a_manifest_that_does_not_load(fields: dict[str, Any], state: str) -> None:
    said, message = gitsource.state_of(_status(**fields), [("a", "Ready"), ("b", "Ready")])
    assert said == state, message
    if state == "Degraded":
        assert "m/a.yaml:3: invalid YAML" in message and BAD[:12] in message, message
        assert "reconcile validate" in message, message


def test_the_page_reads_the_source_and_never_sets_a_torn_file_aside(tmp_path: Path) -> None:
    """peek_status (the gateway's page): the file as the daemon wrote it; a torn one reads
    as none and stays where it is (quarantining is the daemon's)."""
    assert gitsource.peek_status(tmp_path) is None  # follows no source
    _source(tmp_path)
    seen = gitsource.peek_status(tmp_path)
    assert seen is not None and seen.url == "file:///nowhere.git" and seen.branch == "main"
    path = tmp_path / "git" / "source.json"
    assert path.exists(), sorted(p.name for p in tmp_path.rglob("*"))
    path.write_text('{"url": "file:///nowhere.git", "bra')
    assert gitsource.peek_status(tmp_path) is None
    assert path.read_text().endswith('"bra') and not (tmp_path / "quarantine").exists()
