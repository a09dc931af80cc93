"""Key matching alone (issue 28: 11): only the exact key gets in. A near miss, a prefix,
and a key whose SHA-256 shares its first 6 bytes with a known key's all fail, so a
comparison cut short (of the text or of the digest) cannot pass unnoticed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from harness.rawhttp import fragments

from controller.gateway.accounting.keys import KeyFileError, Keys, load, presented

KEY = "sk-Qz7WvKpLmRtYuXnJhGd3"
OTHER = "sk-Vb8NcXeRwTqPoIuYtLk2"
# Found by a birthday search: different keys, SHA-256 digests equal in the first 6 bytes.
TWIN, TWIN_OF = "sk-near-3cf370", "sk-near-167464b"


def keys(tmp_path: Path, *lines: str) -> Keys:
    path = tmp_path / "keys.txt"
    path.write_text("\n".join(lines) + "\n")
    os.chmod(path, 0o600)
    return load(path)


def test_the_twins_really_share_a_digest_prefix() -> None:
    a, b = (hashlib.sha256(k.encode()).digest() for k in (TWIN, TWIN_OF))
    assert a[:6] == b[:6] and a != b


def test_each_exact_key_gets_its_own_label(tmp_path: Path) -> None:
    known = keys(tmp_path, "# comment", KEY, "", OTHER, TWIN)
    labels = {k: known.match(k) for k in (KEY, OTHER, TWIN)}
    assert None not in labels.values() and len(set(labels.values())) == 3, labels


def test_a_byte_order_mark_is_not_part_of_the_first_key(tmp_path: Path) -> None:
    """A key file saved by an editor that writes a BOM (Notepad's "UTF-8 with BOM"): its
    first key works. (It was read as U+FEFF + the key, which no client sends: the gateway
    started with its keys and answered that key 401 forever.)"""
    path = tmp_path / "keys.txt"
    path.write_bytes(("\ufeff" + KEY + "\r\n" + OTHER + "\r\n").encode())
    os.chmod(path, 0o600)
    known = load(path)
    assert known.match(KEY) is not None and known.match(OTHER) is not None
    assert known.match("\ufeff" + KEY) is None


@pytest.mark.parametrize(
    "near",
    [
        KEY[:-1],  # a prefix
        KEY[:4],
        KEY + "x",  # a longer key
        KEY[:-1] + "4",  # the last character off
        "t" + KEY[1:],  # the first character off
        KEY[:10] + KEY[11:],  # one character gone from the middle
        KEY.upper(),
        KEY.lower(),
        f" {KEY}",  # match() compares what it is given; presented() strips
        TWIN_OF,  # a digest equal in its first 6 bytes
        "",
        "sk-",
    ],
)
def test_a_near_miss_does_not_match(tmp_path: Path, near: str) -> None:
    assert keys(tmp_path, KEY, OTHER, TWIN).match(near) is None


def test_none_presented_matches_nothing(tmp_path: Path) -> None:
    assert keys(tmp_path, KEY).match(None) is None


def test_what_a_request_presents() -> None:
    assert presented(f"Bearer {KEY}", None) == KEY
    assert presented(f"bearer   {KEY}  ", None) == KEY
    assert presented(f"Basic {KEY}", None) is None
    assert presented(None, f" {KEY} ") == KEY
    assert presented("Bearer ", None) is None


def test_a_label_holds_no_run_of_its_key(tmp_path: Path) -> None:
    known = keys(tmp_path, KEY, OTHER)
    for key in (KEY, OTHER):
        label = known.match(key)
        assert label is not None
        assert not any(run in label for run in fragments(key, 4)), (key, label)


def test_a_limit_given_twice_is_refused_naming_its_line_not_its_key(tmp_path: Path) -> None:
    """`rpm=5 rpm=6` took the last silently: which one the operator meant is a guess."""
    key = "sk-twice-" + "x" * 24
    path = tmp_path / "keys.txt"
    path.write_text(f"# team\n{key} rpm=5 tpm=100 rpm=6\n")
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError) as caught:
        load(path)
    said = str(caught.value)
    assert f"{path} line 2: rpm= is given twice after the key (keep one)" in said, said
    assert key not in said


def test_a_key_given_twice_is_refused_naming_both_lines_not_the_key(tmp_path: Path) -> None:
    """Two lines with one key were taken silently, the later line's limits winning (a
    trial's `rpm=5` for a team, then the same key pasted lower down with none)."""
    key = "sk-again-" + "y" * 24
    path = tmp_path / "keys.txt"
    path.write_text(f"{key} rpm=5\n{OTHER}\n# pasted again\n{key}\n")
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError) as caught:
        load(path)
    said = str(caught.value)
    assert f"{path} line 4: the same key as line 1 with other limits (keep one line" in said
    assert key not in said and OTHER not in said


def test_a_key_pasted_twice_with_the_same_limits_is_one_key_as_before(tmp_path: Path) -> None:
    """A key file an older reconcile took (one key's line pasted again, as a key handed
    out twice) was refused whole after an upgrade: the daemon exited 64 and did not come
    back. Where the lines say the same, nothing is a guess: it is one key."""
    key = "sk-twice-" + "z" * 24
    found = keys(tmp_path, f"{key} rpm=5", OTHER, f"{key} rpm=5  # again", "sk-bare-1", "sk-bare-1")
    assert [label for _, label in found.digests] == [
        hashlib.sha256(k.encode()).hexdigest()[:8] for k in (key, OTHER, "sk-bare-1")
    ]
    label = found.match(key)
    assert label is not None and found.limits[label].rpm == 5
    assert found.match("sk-bare-1") is not None
