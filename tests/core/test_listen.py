"""``[HOST:]PORT`` for --listen and --metrics-port: one reading for both flags."""

from __future__ import annotations

import pytest

from controller.core.manifest.listen import split_listen


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("8080", ("127.0.0.1", 8080)),
        ("0.0.0.0:8080", ("0.0.0.0", 8080)),
        ("[::1]:9101", ("::1", 9101)),
        ("::1:9101", ("::1", 9101)),
        (":80", ("127.0.0.1", 80)),
        ("h:0", None),
        ("h:65536", None),
        ("x:y", None),
        ("", None),
    ],
)
def test_split_listen(text: str, want: tuple[str, int] | None) -> None:
    assert split_listen(text) == want
