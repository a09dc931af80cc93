"""A newcomer's trial of README, top to bottom, and the slips made on the way (DESIGN
"The command": an error says what, where, and the next move).

Found by typing README's manifest by hand: a line indented too little (`spec:`, then
`engine:` at column 0; `devices:`, then `count:` beside it) fell out of the mapping above
into its parent and got "unknown field (check the spelling; ...)", though the spelling was
right: the error now names the mapping it belongs to, its line, and says to indent it.
"""

from __future__ import annotations

from typing import Any

import pytest

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
