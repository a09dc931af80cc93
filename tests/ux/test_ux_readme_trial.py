"""A newcomer's trial of README, top to bottom, and the slips made on the way (DESIGN
"The command": an error says what, where, and the next move).

Found by typing README's manifest by hand: a line indented too little (`spec:`, then
`engine:` at column 0; `devices:`, then `count:` beside it) fell out of the mapping above
into its parent and got "unknown field (check the spelling; ...)", though the spelling was
right: the error now names the mapping it belongs to, its line, and says to indent it.
README's manifest copied with its Markdown fence (```yaml) got PyYAML's "found character
that cannot start any token" alone; one copied from a web page, indented with no-break
spaces, got "indented deeper than the key above it" on the line after the one pasted.
`-f manifests/web.yml` beside `web.yaml` (or `-f manifest` beside `manifests`) said only
"does not exist": it now says which name was likely meant. README's manifest with
`command:` under `engine: vllm` (only `engine: command` takes one) was reported on the
`spec:` line, not the `command:` one, with no next move. `history` and `rollback` on a
node with no git source said so with no next move, where `source` gave one.
`reconcile --dry-run` exits 2 when a pass would change something (it is `plan`), but
`reconcile --help`'s exit codes named 0, 1 and 64 only. `drain --ttl 1 hour` (the unit
apart) got "unrecognized arguments: hour", and `--once --wait --timeout 10 minutes`
argparse's list of verbs for `minutes`, neither saying a duration is one word.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from controller.cli import main as cli
from controller.cli.mistyped import DURATION_FLAGS

HEAD = "apiVersion: reconcile/v1\nkind: Deployment\nmetadata:\n  name: web\n"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        pytest.param(
            "spec:\nengine: command\ncommand: [x]\n",
            ":6: engine: unknown field: it is a field of `spec` (line 5): indent it under `spec:`",
            id="spec-fields-at-column-0",
        ),
        pytest.param(
            "spec:\n  engine: command\n  command: [x]\n  devices:\n  count: 1\n",
            ":9: spec.count: unknown field: it is a field of `spec.devices` (line 8): "
            "indent it under `devices:`",
            id="devices-count-beside-devices",
        ),
        pytest.param(
            "spec:\n  engine: command\n  command: [x]\n  readiness:\n"
            "    tcpSocket: {}\n  periodSeconds: 2\n",
            ":10: spec.periodSeconds: unknown field: it is a field of `spec.readiness` (line 8): "
            "indent it under `readiness:`",
            id="the-last-field-of-a-mapping-dedented",
        ),
    ],
)
def test_a_line_indented_too_little_is_told_where_it_belongs(
    reconcile: Any, body: str, said: str
) -> None:
    bad = reconcile.manifests / "web.yaml"
    bad.write_text(HEAD + body)
    result = reconcile("validate", check=1)
    assert f"{bad}{said}" in result.err, result
    assert "check the spelling" not in result.err and "Traceback" not in result.err, result


def test_a_misspelt_field_still_gets_its_did_you_mean(reconcile: Any) -> None:
    """The indentation hint is for an exact name of the mapping above, not a near one."""
    bad = reconcile.manifests / "web.yaml"
    bad.write_text(HEAD + "spec:\n  engine: command\n  comand: [x]\n  readiness:\n")
    result = reconcile("validate", check=1)
    assert f"{bad}:7: spec.comand: unknown field: did you mean `command`?" in result.err, result


SPEC = "spec:\n  engine: command\n  command: [x]\n"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        pytest.param(
            "```yaml\n" + HEAD + SPEC + "```\n",
            ":1: invalid YAML: found character that cannot start any token (a Markdown code "
            "fence: keep only the lines between the fences)",
            id="a-readme-block-with-its-fence",
        ),
        pytest.param(
            HEAD + "spec:\n\u00a0 engine: command\n  command: [x]\n",
            ":6: invalid YAML: mapping values are not allowed in this context (a U+00A0 space "
            "at column 1, pasted from a page: YAML indents with plain spaces only: retype the "
            "indent)",
            id="an-indent-of-no-break-spaces",
        ),
        pytest.param(
            HEAD.replace("  name: web\n", '  name: web\n  labels: {a: "x\n\u00a0 y"}\n')
            + "spec:\n  engine: command\n\tcommand: [x]\n",
            ":9: invalid YAML: found a tab character that violates indentation (a tab at "
            "column 1: YAML indents with spaces only)",
            id="a-no-break-space-in-a-string-is-not-blamed",
        ),
    ],
)
def test_a_manifest_pasted_from_a_page_names_what_the_paste_left(
    reconcile: Any, text: str, said: str
) -> None:
    bad = reconcile.manifests / "web.yaml"
    bad.write_text(text, encoding="utf-8")
    result = reconcile("validate", check=1)
    assert f"{bad}{said}" in result.err, result


def test_a_missing_path_one_slip_from_a_real_one_gets_a_did_you_mean(reconcile: Any) -> None:
    reconcile.write("web")
    folder = reconcile.manifests
    yml = reconcile("validate", "-f", str(folder / "web.yml"), check=1)
    said = f"manifest file {folder}/web.yml does not exist (did you mean {folder}/web.yaml?)"
    assert said in yml.err, yml
    once = reconcile("--once", "-f", f"{folder}/web.yml", check=1)
    assert said in once.err and "nothing pruned" in once.err, once
    typo = reconcile("validate", "-f", str(folder)[:-1], check=1)
    said = f"manifests folder {str(folder)[:-1]} does not exist (did you mean {folder}?)"
    assert said in typo.err, typo


def test_a_missing_folder_is_offered_a_folder_not_a_file(reconcile: Any) -> None:
    """A near name of the other kind (a file for a folder) is no near miss."""
    (reconcile.tmp / "prod.yaml").write_text("# not a folder\n")
    (reconcile.tmp / "prod-yam").mkdir()
    result = reconcile("validate", "-f", str(reconcile.tmp / "prodyaml"), check=1)
    said = f"manifests folder {reconcile.tmp / 'prodyaml'} does not exist"
    assert f"{said} (did you mean {reconcile.tmp / 'prod-yam'}?)" in result.err, result


def test_a_field_a_check_across_the_spec_refuses_is_shown_on_its_own_line(
    reconcile: Any,
) -> None:
    bad = reconcile.manifests / "web.yaml"
    bad.write_text(HEAD + "spec:\n  engine: vllm\n  model: m/m\n  command: [serve]\n")
    result = reconcile("validate", check=1)
    said = (
        f"{bad}:8: spec.command: spec.command is only for engine 'command', not 'vllm': add "
        "flags to the vllm recipe's argv with spec.args, or set engine: command"
    )
    assert said in result.err, result
    bad.write_text(HEAD + "spec:\n  engine: vllm\n  args: [--served-model-name, '{model}']\n")
    result = reconcile("validate", check=1)
    assert f"{bad}:7: spec.args: spec.args uses {{model}}, but" in result.err, result


@pytest.mark.parametrize("verb", [["source"], ["history"], ["rollback"], ["rollback", "--resume"]])
def test_each_git_verb_on_a_node_with_no_git_source_says_the_next_move(
    reconcile: Any, verb: list[str]
) -> None:
    result = reconcile(*verb, check=1)
    said = (
        f"reconcile: state dir {reconcile.state} follows no git source (start the daemon "
        "with --git URL, or set git.url in node.yaml)\n"
    )
    assert result.err == said, result


def test_the_exit_code_of_a_dry_run_is_in_the_help(reconcile: Any) -> None:
    reconcile.write("web")
    dry = reconcile("--dry-run", check=2)
    assert "+ web" in dry.out, dry
    codes = reconcile("--help", check=0).out.split("exit codes:")[1]
    assert "\n  2   --dry-run: changes pending" in codes, codes


@pytest.mark.parametrize(
    ("args", "said"),
    [
        pytest.param(
            ["drain", "--ttl", "1", "hour"],
            "unrecognized arguments: hour: a duration is one word: write `--ttl 1h`",
            id="after-a-verb",
        ),
        pytest.param(
            ["--once", "--wait", "--timeout", "10", "minutes"],
            "'minutes' is no verb: a duration is one word: write `--timeout 10m`",
            id="taken-for-the-verb",
        ),
    ],
)
def test_a_durations_unit_left_apart_is_said_to_join_it(
    reconcile: Any, args: list[str], said: str
) -> None:
    result = reconcile(*args, check=64)
    assert said in result.err, result
    after = reconcile("uncordon", check=0)  # a usage error drained nothing
    assert "was not drained" in after.out + after.err, after


def test_a_count_is_not_said_to_be_a_duration(reconcile: Any) -> None:
    result = reconcile("logs", "web", "--tail", "5", "s", check=64)
    assert "duration" not in result.err, result


def test_the_duration_flags_are_those_the_parser_parses_as_durations() -> None:
    found: set[str] = set()
    parsers = [cli.build_parser()]
    while parsers:
        for action in parsers.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
            elif action.type in (cli.duration, cli.positive_duration):
                found.add(max(action.option_strings, key=len))
    assert found == DURATION_FLAGS
