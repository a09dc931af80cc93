"""Node labels and spec.nodeSelector: the syntax, the match, a node's share and what
`plan` says of the rest (DESIGN.md "A fleet from one repository")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from strategies import spec_body

from controller.core.manifest.labels import (
    kept_apart,
    kept_note,
    key_problem,
    matches,
    share,
    skip_note,
    value_problem,
)
from controller.core.manifest.labelsyntax import parse_selector
from controller.core.manifest.specerrors import problems
from controller.core.manifest.specs import Deployment, Entry, spec_hash
from controller.errors import ConfigError
from controller.store.config.nodeconfig import read_node_file


def doc(name: str = "web", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": spec_body(**spec),
    }


def entry(name: str, **selector: str) -> Entry:
    deployment = Deployment.model_validate(doc(name, nodeSelector=selector))
    return Entry(deployment, f"{name}.yaml", 1, spec_hash(deployment.spec))


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("gpu", id="plain"),
        pytest.param("GPU.model_2-x", id="mixed-case-dots-underscores"),
        pytest.param("example.com/gpu", id="dns-prefix"),
        pytest.param("a" * 63, id="63-chars"),
        pytest.param("x", id="one-char"),
    ],
)
def test_label_keys_kubernetes_takes(key: str) -> None:
    assert key_problem(key) is None


@pytest.mark.parametrize(
    ("key", "says"),
    [
        pytest.param("", "the name must be", id="empty"),
        pytest.param("a" * 64, "at most 63", id="64-chars"),
        pytest.param("-gpu", "alphanumeric at both ends", id="leading-dash"),
        pytest.param("gpu.", "alphanumeric at both ends", id="trailing-dot"),
        pytest.param("gpu type", "letters, digits", id="space"),
        pytest.param("Example.com/gpu", "DNS subdomain", id="upper-case-prefix"),
        pytest.param("/gpu", "DNS subdomain", id="empty-prefix"),
        pytest.param("example.com/", "the name must be", id="empty-name"),
        pytest.param("a/b/c", "DNS subdomain", id="two-slashes"),
    ],
)
def test_label_keys_kubernetes_refuses(key: str, says: str) -> None:
    problem = key_problem(key)
    assert problem is not None and says in problem and repr(key) in problem


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        pytest.param("h100", True, id="plain"),
        pytest.param("", True, id="empty"),
        pytest.param("v1.2_rc-3", True, id="dots-underscores-dashes"),
        pytest.param("a" * 64, False, id="64-chars"),
        pytest.param("h100-", False, id="trailing-dash"),
        pytest.param("a/b", False, id="slash"),
    ],
)
def test_label_values(value: str, ok: bool) -> None:
    assert (value_problem(value) is None) is ok


@pytest.mark.parametrize(
    ("selector", "labels", "ok"),
    [
        pytest.param({}, {}, True, id="no-selector-no-labels"),
        pytest.param({}, {"gpu": "h100"}, True, id="no-selector-runs-everywhere"),
        pytest.param({"gpu": "h100"}, {"gpu": "h100", "site": "lab2"}, True, id="subset"),
        pytest.param({"gpu": "h100", "site": "lab2"}, {"gpu": "h100"}, False, id="pair-missing"),
        pytest.param({"gpu": "h100"}, {"gpu": "a100"}, False, id="other-value"),
        pytest.param({"gpu": "h100"}, {}, False, id="node-without-labels"),
        pytest.param({"gpu": ""}, {"gpu": ""}, True, id="empty-value-matches-empty"),
        pytest.param({"gpu": ""}, {}, False, id="empty-value-needs-the-key"),
    ],
)
def test_a_selector_matches_when_every_pair_is_a_label(
    selector: dict[str, str], labels: dict[str, str], ok: bool
) -> None:
    assert matches(selector, labels) is ok


def test_share_keeps_the_matching_and_names_the_selector_of_the_rest() -> None:
    entries = {
        "any": entry("any"),
        "big": entry("big", gpu="h100"),
        "small": entry("small", gpu="a10", site="lab2"),
    }
    kept, skipped = share(entries, {"gpu": "h100"}, lambda e: e.deployment.spec.node_selector)
    assert sorted(kept) == ["any", "big"]
    assert skipped == {"small": "gpu=a10,site=lab2"}


@pytest.mark.parametrize(
    ("skipped", "said"),
    [
        pytest.param({}, None, id="none"),
        pytest.param(
            {"a": "gpu=h100"},
            "1 deployment skipped: nodeSelector gpu=h100 does not match this node's labels",
            id="one",
        ),
        pytest.param(
            {"a": "gpu=h100", "b": "gpu=h100", "c": "gpu=h100"},
            "3 deployments skipped: nodeSelector gpu=h100 does not match this node's labels",
            id="three-one-selector",
        ),
        pytest.param(
            {"a": "gpu=h100", "b": "site=lab2"},
            "2 deployments skipped: nodeSelector gpu=h100; site=lab2 do not match this node's"
            " labels",
            id="two-selectors",
        ),
    ],
)
def test_the_skip_note(skipped: dict[str, str], said: str | None) -> None:
    assert skip_note(skipped) == said


def test_what_runs_here_is_kept_apart_from_the_skipped() -> None:
    """A broken manifest whose selector names other nodes is skipped, but one whose
    engine this node runs on (a record here) is said as kept, not counted as skipped."""
    skipped = {"a": "gpu=a10", "b": "gpu=a10", "c": "gpu=a10"}
    assert kept_apart(skipped, {"c", "a", "mine"}) == ({"b": "gpu=a10"}, ["a", "c"])
    assert kept_apart(skipped, set()) == (skipped, [])
    assert kept_note([]) is None
    assert kept_note(["c", "a"]) == (
        "2 deployments kept here with their specs invalid: a, c "
        "(nothing is moved until their manifests load)"
    )


def test_a_bad_selector_is_an_error_at_its_field() -> None:
    data = doc(nodeSelector={"gpu type": "h100"})
    with pytest.raises(ValidationError) as info:
        Deployment.model_validate(data)
    found = problems(info.value, data)
    assert found[0].path == "spec.nodeSelector", found
    assert "label key 'gpu type'" in found[0].message, found


def test_the_selector_is_no_part_of_what_runs() -> None:
    """A selector added or changed while the node still matches restarts nothing."""
    plain = Deployment.model_validate(doc()).spec
    chosen = Deployment.model_validate(doc(nodeSelector={"gpu": "h100"})).spec
    assert spec_hash(plain) == spec_hash(chosen)


def test_node_yaml_labels_are_read_and_a_bad_one_names_file_line_and_field(
    tmp_path: Path,
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("maxInstances: 2\nlabels: {gpu: h100, example.com/site: lab2}\n")
    assert read_node_file(str(good), tmp_path).labels == {
        "gpu": "h100",
        "example.com/site": "lab2",
    }
    bad = tmp_path / "bad.yaml"
    bad.write_text("maxInstances: 2\nlabels:\n  gpu: h100\n  site: lab 2\n")
    with pytest.raises(ConfigError) as info:
        read_node_file(str(bad), tmp_path)
    said = str(info.value)
    assert said.startswith(f"{bad}:"), said
    assert "labels" in said and "label value 'lab 2'" in said, said
    assert "Traceback" not in said


def test_the_skip_note_when_the_labels_could_not_be_read() -> None:
    said = skip_note({"a": "gpu=h100"}, labels_read=False)
    assert said is not None and said.startswith("1 deployment with a nodeSelector skipped")
    assert "could not be read (node.yaml)" in said and "nothing they run is stopped" in said


@pytest.mark.parametrize(
    ("text", "said"),
    [
        pytest.param(
            "labels:\n\tgpu: h100\n",
            "bad.yaml:2: invalid YAML: found character '\\t' that cannot start any token (a tab "
            "at column 1: YAML indents with spaces only)",
            id="tab",
        ),
        pytest.param(
            "maxInstances:2\nlabels: {}\n",
            "bad.yaml:1: invalid YAML: mapping values are not allowed here (a key needs ': ', "
            "a colon and a space: write `maxInstances: 2`)",
            id="key-without-its-space",
        ),
    ],
)
def test_a_yaml_slip_in_node_yaml_is_said_as_in_a_manifest(
    tmp_path: Path, text: str, said: str
) -> None:
    """node.yaml is YAML a person writes too: its slips get the manifests' words."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_node_file(str(bad), tmp_path)
    assert str(info.value).startswith(f"{tmp_path}/{said}"), info.value


def test_every_problem_of_node_yaml_is_said_with_the_setting_meant(tmp_path: Path) -> None:
    """node.yaml said its first problem only, and an unknown setting listed every setting
    of every level: each problem is said, where it is, with the one meant when close."""
    bad = tmp_path / "node.yaml"
    bad.write_text(
        "maxInstances: two\nmaxInstance: 1\ngit: {url: x, brnach: main}\n"
        "notify: [{url: 'http://h', evnets: [Failed]}]\nlisten: 80\n"
    )
    with pytest.raises(ConfigError) as info:
        read_node_file(str(bad), tmp_path)
    said = str(info.value).split("; ")
    for expected in (
        f"{bad}:1: maxInstances: Input should be a valid integer",
        f"{bad}:2: maxInstance: unknown setting: did you mean `maxInstances`?",
        f"{bad}:3: git.brnach: unknown setting: did you mean `branch`?",
        f"{bad}:4: notify[0].evnets: unknown setting: did you mean `events`?",
        f"{bad}:5: listen: unknown setting (here: maxInstances, maxInstancesPerKind,",
    ):
        assert any(s.startswith(expected) for s in said), (expected, said)


# -- `-l`: selectors as kubectl reads them -----------------------------------------------

LABELS = {"team": "search", "tier": "prod", "example.com/gpu": "h100"}


@pytest.mark.parametrize(
    ("selector", "holds"),
    [
        pytest.param("team=search", True, id="equal"),
        pytest.param("team==search", True, id="double-equal"),
        pytest.param("team=search,tier=dev", False, id="comma-is-and"),
        pytest.param("team=search, tier = prod", True, id="spaces-around"),
        pytest.param("team!=infra", True, id="not-equal"),
        pytest.param("owner!=me", True, id="not-equal-holds-where-absent"),
        pytest.param("tier", True, id="exists"),
        pytest.param("!tier", False, id="absent"),
        pytest.param("!owner", True, id="absent-holds"),
        pytest.param("tier in (dev,prod)", True, id="in"),
        pytest.param("tier notin (dev, prod),team", False, id="notin-then-exists"),
        pytest.param("example.com/gpu=h100", True, id="prefixed-key"),
        pytest.param("team=", False, id="empty-value"),
    ],
)
def test_a_selector_holds_as_kubectl_says(selector: str, holds: bool) -> None:
    assert all(r.holds(LABELS) for r in parse_selector(selector)) is holds


@pytest.mark.parametrize(
    ("selector", "said"),
    [
        pytest.param("bad key=@", "'bad key=@': label key 'bad key': the name must be", id="key"),
        pytest.param("team=@", "'team=@': label value '@' must be empty or", id="value"),
        pytest.param("=x", "'=x': no key before '='", id="no-key"),
        pytest.param("a=b=c", "label value 'b=c'", id="two-equals"),
        pytest.param("team=a,,b", "'' in 'team=a,,b': an empty requirement", id="stray-comma"),
        pytest.param("team in (a,b", "in (A,B)", id="unclosed-set"),
        pytest.param("Example.com/gpu", "the prefix before '/' must be a DNS", id="prefix"),
    ],
)
def test_a_selector_that_is_none_says_what_is_wrong_in_it(selector: str, said: str) -> None:
    """It silently matched nothing: `status -l 'bad key=@'` said "No deployments."."""
    with pytest.raises(ValueError, match="a selector is KEY, !KEY, KEY=VALUE") as caught:
        parse_selector(selector)
    assert said in str(caught.value), caught.value
