"""``controller.core.plan`` is the planner's public entry; ``controller.core.planner`` its parts.

Callers (reconciler, CLI, Ray actor, benchmarks) import from ``plan`` only, so the
policies can move between the planner's modules without touching them.
"""

from __future__ import annotations

import ast
from pathlib import Path

from controller.core import plan

PACKAGE = Path(__file__).resolve().parents[2] / "controller"


def test_the_public_names_are_pinned() -> None:
    assert sorted(plan.__all__) == [
        "BACKOFF_FIRST",
        "BACKOFF_MAX",
        "BACKOFF_RESET",
        "Desired",
        "EMPTIED",
        "IN_PLACE",
        "PREEMPTED",
        "PREEMPTIBLE",
        "RESTARTED",
        "backoff",
        "is_turn",
        "leader_of",
        "makes_room",
        "plan",
        "rekeyed",
        "restarts_after",
        "waits_turn",
    ]
    assert all(hasattr(plan, name) for name in plan.__all__)


def test_only_the_planner_imports_its_parts() -> None:
    """Outside core/plan.py and core/planner/, nobody reaches into the planner's modules."""
    inside = PACKAGE / "core" / "planner"
    bad = [
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in PACKAGE.rglob("*.py")
        if path != PACKAGE / "core" / "plan.py" and inside not in path.parents
        for name in _imported(path)
        if name.startswith("controller.core.planner")
    ]
    assert not bad, bad


def _imported(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return names
