"""The Ray modules run in the order that starts the fewest clusters (rayhelp.order_modules)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rayhelp import FIRST, HERE, LAST, order_modules


class _Item:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __repr__(self) -> str:
        return self.path.name


def test_the_container_module_comes_first_head_loss_last_and_others_keep_their_places() -> None:
    before, after = Path("tests/cli/test_a.py").resolve(), Path("tests/store/test_b.py").resolve()
    names = ["test_ray_backend.py", "test_ray_config.py", FIRST.name, LAST.name, "test_ray_pull.py"]
    items: list[Any] = [_Item(before), *(_Item(HERE / n) for n in names for _ in range(2))]
    items.append(_Item(after))
    order_modules(items)
    assert [item.path.name for item in items] == [
        "test_a.py",
        *(n for n in (FIRST.name, *names[:2], names[4], LAST.name) for _ in range(2)),
        "test_b.py",
    ]
