"""llama.cpp's ``--api-key-file FILE``, read when the manifest is (store/sources/keyfile.py).

llama-server takes each non-empty line of the file as a key. reconcile never read it, so
the probes presented none and a ``completion`` probe got 401 until the deadline, while
`validate` said the manifest was fine. A file it cannot read is now said at the flag's
line, with the next move; the key is never printed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.core.digest import sha256_hex
from controller.core.manifest.specs import Entry
from controller.reconciler.run import resolve_secrets
from controller.store.sources.manifests import LoadResult, load
from tests.engines.sidefile import load_beside

KEY = "file-key-7c1e"


def write(tmp_path: Path, keys: str | None, args: list[str], **spec: object) -> LoadResult:
    """A llama-cpp manifest giving ``args`` (``{keys}``: the key file, written when given)."""
    return load_beside(
        tmp_path, ("llama-cpp", "/models/tiny.gguf"), ("keys", "{keys}", keys), args, **spec
    )


ARGS = ["--threads", "1", "--api-key-file", "{keys}"]
ARGS_LINE = 11  # the manifest's line of `- --api-key-file` (safe_dump: `args:` is line 8)


@pytest.mark.parametrize(
    ("keys", "args", "said", "move"),
    [
        (None, ARGS, "which reconcile cannot read (No such file", "fix the path or its mode"),
        (f"{KEY}\n", ["--api-key-file", "keys"], "a relative path", "absolute path"),
    ],
    ids=["missing", "relative"],
)
def test_a_key_file_reconcile_cannot_read_is_said_at_its_line(
    tmp_path: Path, keys: str | None, args: list[str], said: str, move: str
) -> None:
    loaded = write(tmp_path, keys, args)
    assert "chat" not in loaded.entries
    (error,) = loaded.errors
    text = str(error)
    line = ARGS_LINE if args is ARGS else ARGS_LINE - 2
    assert f"chat.yaml:{line}: spec.args" in text, text
    assert said in text and "--api-key-file" in text and text.endswith(move), text
    assert KEY not in text


def test_an_unreadable_key_file_is_said(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()  # a folder where the file should be
    (error,) = write(tmp_path, None, ARGS).errors
    assert "which is not a file: give the key file's path" in str(error), error


def test_the_files_first_key_is_the_probes(tmp_path: Path) -> None:
    """The first non-empty line, as llama-server's reader takes it; through a container's
    bind mount too; never in the entry's repr."""
    loaded = write(tmp_path, f"\n{KEY}\nsecond\n", ARGS)
    assert loaded.errors == []
    entry = loaded.entries["chat"]
    assert entry.file_key == KEY and KEY not in repr(entry)
    bound = write(
        tmp_path / "c",
        None,
        ["--api-key-file", "/etc/llama/keys"],
        container={"image": "llama:local", "volumes": [f"{tmp_path}:/etc/llama:ro"]},
    )
    assert bound.errors == [] and bound.entries["chat"].file_key == KEY


def test_a_path_the_engine_alone_reads_is_left_to_it(tmp_path: Path) -> None:
    in_image = write(tmp_path, None, ["--api-key-file", "/opt/keys"], container={"image": "x"})
    placeholder = write(tmp_path / "p", None, ["--api-key-file", "/etc/{name}.keys"])
    for loaded in (in_image, placeholder):
        assert loaded.errors == [] and loaded.entries["chat"].file_key == ""


def _hashed(loaded: LoadResult, key: bytes | None = b"k" * 32) -> Entry:
    """The entry as a pass gives it its hash: the file's digest under the secrets key."""
    resolve_secrets(loaded, lambda: key, None, here=lambda _entry: True)
    return loaded.entries["chat"]


def test_the_files_bytes_join_the_hash_keyed(tmp_path: Path) -> None:
    """An edit of the key file changed no hash: llama-server, which reads it only at its
    start, kept the old key while the probes presented the new one, and liveness
    restarted it as "not live". Its bytes now join the hash, keyed as envFrom's values
    are: the same file, the same hash; any edit (a key added to an empty file too), a new
    one; the key in no digest or repr, and the digest not its plain sha256."""
    plain = write(tmp_path, f"{KEY}\n", ARGS).entries["chat"]

    def edited(text: str, key: bytes = b"k" * 32) -> Entry:
        (tmp_path / "keys").write_text(text)
        return _hashed(load([tmp_path / "manifests"], backend="local"), key)

    hashed = edited(f"{KEY}\n")
    assert hashed.hash != plain.hash and hashed.hash == edited(f"{KEY}\n").hash
    assert len({hashed.hash, edited("other\n").hash, edited("").hash}) == 3, "an edit"
    assert edited(f"{KEY}\n", b"j" * 32).key_file_digest != hashed.key_file_digest
    assert hashed.key_file_digest != sha256_hex(f"{KEY}\n".encode()), "keyed, not plain"
    assert KEY not in repr(hashed) and KEY not in hashed.hash + hashed.key_file_digest
    image = write(tmp_path / "i", None, ["--api-key-file", "/opt/keys"], container={"image": "x"})
    assert _hashed(image).hash == image.entries["chat"].hash, "the engine's file alone"
