"""controller/host/secrets.py on real files: dotenv quoting, the 0600 rule, errors that
name the file and line but never a value."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from envfrom.agekey import make_key

from controller.core.manifest.specs import DeploymentSpec
from controller.host import secrets
from controller.host.secrets import SecretError, parse_dotenv
from controller.store.sources import security


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("A=1\nB=two\n", {"A": "1", "B": "two"}, id="plain"),
        pytest.param("# c\n\n  # indented\nA=1", {"A": "1"}, id="comments-and-blanks"),
        pytest.param("export A=1\n", {"A": "1"}, id="export-prefix"),
        pytest.param("A = spaced \n", {"A": "spaced"}, id="spaces-around"),
        pytest.param("A=x # note\n", {"A": "x"}, id="trailing-comment"),
        pytest.param("A=x#not-a-comment\n", {"A": "x#not-a-comment"}, id="hash-in-value"),
        pytest.param("A='lit $B \\n # x'\n", {"A": "lit $B \\n # x"}, id="single-literal"),
        pytest.param('A="a\\nb \\"q\\" \\\\"\n', {"A": 'a\nb "q" \\'}, id="double-escapes"),
        pytest.param('A="x" # note\n', {"A": "x"}, id="double-then-comment"),
        pytest.param("A='one\ntwo'\nB=3\n", {"A": "one\ntwo", "B": "3"}, id="multi-line"),
        pytest.param("A=\n", {"A": ""}, id="empty"),
        pytest.param("A=1\nA=2\n", {"A": "2"}, id="last-wins"),
        pytest.param("A=b=c\n", {"A": "b=c"}, id="equals-in-value"),
    ],
)
def test_dotenv(text: str, expected: dict[str, str]) -> None:
    assert parse_dotenv(text, "f.env") == expected


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        pytest.param("A=1\nhunter2\n", 2, "not a KEY=VALUE line", id="no-equals"),
        pytest.param("1A=hunter2\n", 1, "not a KEY=VALUE line", id="bad-name"),
        pytest.param("A='hunter2\n", 1, "single quote is not closed", id="open-single"),
        pytest.param('A="hunter2\n', 1, "double quote is not closed", id="open-double"),
        pytest.param("A='x' hunter2\n", 1, "text after the closing quote", id="after-quote"),
    ],
)
def test_dotenv_errors_name_the_line_not_its_text(text: str, line: int, words: str) -> None:
    with pytest.raises(SecretError) as caught:
        parse_dotenv(text, "/etc/f.env")
    message = str(caught.value)
    assert message.startswith(f"/etc/f.env:{line}: ") and words in message, message
    assert "hunter2" not in message


def _spec(*items: dict[str, str]) -> DeploymentSpec:
    return DeploymentSpec.model_validate({"engine": "command", "command": ["x"], "envFrom": items})


def test_a_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.env"
    path.write_text("TOKEN=hunter2\n")
    path.chmod(0o640)
    with pytest.raises(SecretError) as caught:
        secrets.resolve(_spec({"file": str(path)}), tmp_path)
    message = str(caught.value)
    assert str(path) in message and "0640" in message and "chmod 600" in message
    assert "hunter2" not in message
    path.chmod(0o600)
    assert secrets.resolve(_spec({"file": str(path)}), tmp_path) == {"TOKEN": "hunter2"}


def test_a_file_giving_cuda_device_order_reconcile_s_own_value_is_taken(
    tmp_path: Path,
) -> None:
    """An envFrom file may say CUDA_DEVICE_ORDER=PCI_BUS_ID (reconcile's own value), as
    spec.env may; another value is refused naming the key, never the value."""
    path = tmp_path / "s.env"
    path.write_text("CUDA_DEVICE_ORDER=PCI_BUS_ID\nTOKEN=hunter2\n")
    path.chmod(0o600)
    env = secrets.resolve(_spec({"file": str(path)}), tmp_path)
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "TOKEN": "hunter2"}
    path.write_text("CUDA_DEVICE_ORDER=FASTEST_FIRST\n")
    with pytest.raises(SecretError) as caught:
        secrets.resolve(_spec({"file": str(path)}), tmp_path)
    assert "sets CUDA_DEVICE_ORDER: reconcile sets CUDA_DEVICE_ORDER" in str(caught.value)
    assert "FASTEST_FIRST" not in str(caught.value)


def test_later_items_win_and_the_digest_hides_values(tmp_path: Path) -> None:
    first, second = tmp_path / "a.env", tmp_path / "b.env"
    for path, text in ((first, "A=1\nB=1\n"), (second, "B=2\n")):
        path.write_text(text)
        path.chmod(0o600)
    env = secrets.resolve(_spec({"file": str(first)}, {"file": str(second)}), tmp_path)
    assert env == {"A": "1", "B": "2"}
    key = b"k" * 32
    assert secrets.digest(env, key) != secrets.digest({"A": "1", "B": "1"}, key)
    assert secrets.digest(env, key) == secrets.digest({"B": "2", "A": "1"}, key)  # order-free


def test_the_digest_is_keyed_so_a_guess_needs_the_key() -> None:
    """The unkeyed sha256 let anyone who reads a record try short secrets offline."""
    env = {"PASSWORD": "hunter2"}
    one, other = secrets.digest(env, b"1" * 32), secrets.digest(env, b"2" * 32)
    assert one != other  # without the key, no guess can be checked against it
    assert secrets.unkeyed_digest(env) not in (one, other)


def test_a_missing_file_is_named_with_its_item(tmp_path: Path) -> None:
    path = tmp_path / "absent.env"
    ok = tmp_path / "ok.env"
    ok.write_text("A=1\n")
    ok.chmod(0o600)
    with pytest.raises(SecretError) as caught:
        secrets.resolve(_spec({"file": str(ok)}, {"file": str(path)}), tmp_path)
    assert caught.value.index == 1 and f"file {path} does not exist" in str(caught.value)


def test_unchanged_sops_files_are_not_decrypted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon passes every few seconds: one sops run per version of each file. Proved by
    taking sops off PATH: the unchanged files still resolve, a rewritten one cannot."""
    key = make_key(tmp_path / "keys")
    folder = tmp_path / "m"
    paths = [key.encrypt(f"{name}=v-{name}\n", folder / "secrets" / f"{name}.env") for name in "AB"]
    spec = _spec({"sopsFile": "secrets/A.env"}, {"sopsFile": "secrets/B.env"})
    monkeypatch.setenv("SOPS_AGE_KEY_FILE", str(key.file))
    first = secrets.resolve(spec, folder)
    assert first == {"A": "v-A", "B": "v-B"}
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs"))
    assert secrets.resolve(spec, folder) == first  # both files kept, neither decrypted again
    paths[1].write_bytes(paths[1].read_bytes() + b"\n")  # a new version (size and mtime)
    with pytest.raises(SecretError) as caught:
        secrets.resolve(spec, folder)
    assert caught.value.index == 1 and "not on PATH" in str(caught.value)
    assert "sopsFile secrets/B.env:" in str(caught.value)  # as the manifest wrote it


# Each breakage: the key file SOPS_AGE_KEY_FILE names, and the sopsFile the spec names.
Breakage = Callable[[Path, Path], tuple[Path, str]]
NAMED = "secrets/x.env"


def _no_key_file(folder: Path, secret: Path) -> tuple[Path, str]:
    return folder / "keys" / "absent.agekey", NAMED


def _not_a_key(folder: Path, secret: Path) -> tuple[Path, str]:
    garbage = folder / "keys" / "garbage.agekey"
    garbage.write_text("this is no age key\n")
    garbage.chmod(0o600)
    return garbage, NAMED


def _another_nodes_key(folder: Path, secret: Path) -> tuple[Path, str]:
    return make_key(folder / "keys", "other").file, NAMED


def _line_deleted(folder: Path, secret: Path) -> tuple[Path, str]:
    lines = secret.read_text().splitlines(keepends=True)
    secret.write_text("".join(line for line in lines if not line.startswith("B=")))
    return folder / "keys" / "node.agekey", NAMED


def _value_edited(folder: Path, secret: Path) -> tuple[Path, str]:
    lines = secret.read_text().splitlines(keepends=True)
    secret.write_text("".join("B=hand-typed-s3cret\n" if x.startswith("B=") else x for x in lines))
    return folder / "keys" / "node.agekey", NAMED


def _nested(folder: Path, secret: Path) -> tuple[Path, str]:
    """A YAML secrets file with a map in it: no dotenv can hold that."""
    key = folder / "keys" / "node.agekey"
    recipient = subprocess.run(
        ["age-keygen", "-y", str(key)], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
    done = subprocess.run(
        [
            "sops",
            "--encrypt",
            "--age",
            recipient,
            "--input-type=yaml",
            "--output-type=yaml",
            "/dev/stdin",
        ],
        input=b"A: s3cret-a\nB:\n  inner: s3cret-b\n",
        capture_output=True,
        check=True,
        timeout=60,
    )
    secret.with_suffix(".yaml").write_bytes(done.stdout)
    return key, "secrets/x.yaml"


@pytest.mark.parametrize(
    ("breakage", "says"),
    [
        pytest.param(_no_key_file, "absent.agekey does not exist on this node", id="no-key-file"),
        pytest.param(_not_a_key, "garbage.agekey holds no age key", id="not-a-key"),
        pytest.param(_another_nodes_key, "is not one of its recipients", id="another-key"),
        pytest.param(_line_deleted, "its MAC does not match its values", id="mac-mismatch"),
        pytest.param(_value_edited, "a value is not sops' ENC[...]", id="value-edited"),
        pytest.param(_nested, "it holds a nested value (a map or a list)", id="nested-yaml"),
    ],
)
def test_each_sops_failure_says_its_own_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, breakage: Breakage, says: str
) -> None:
    """Every way a sopsFile fails to open, with the real sops: the message names the cause
    and its next move (a missing key file is no recipient problem; a file edited by hand
    is no key problem), and never a value, not even one typed in by hand."""
    key = make_key(tmp_path / "keys")
    secret = key.encrypt("A=s3cret-a\nB=s3cret-b\n", tmp_path / "m" / NAMED)
    key_file, named = breakage(tmp_path, secret)
    monkeypatch.setenv("SOPS_AGE_KEY_FILE", str(key_file))
    with pytest.raises(SecretError) as caught:
        secrets.resolve(_spec({"sopsFile": named}), tmp_path / "m")
    message = str(caught.value)
    assert message.startswith(f"sopsFile {named} cannot be decrypted: ") and says in message
    assert "s3cret" not in message
    wrong = "MAC" if breakage is _another_nodes_key else "recipients"
    assert wrong not in message, message


def test_an_unset_age_key_file_says_the_daemon_reads_it_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With SOPS_AGE_KEY_FILE unset the message said only to set it, and the source's
    Degraded added "the next pass reads it again": a daemon reads its environment at its
    start, so its passes never saw the variable put in its unit until it was restarted."""
    key = make_key(tmp_path / "keys")
    key.encrypt("A=s3cret-a\n", tmp_path / "m" / NAMED)
    monkeypatch.delenv("SOPS_AGE_KEY_FILE", raising=False)
    monkeypatch.delenv("SOPS_AGE_KEY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # sops' own default
    with pytest.raises(SecretError) as caught:
        secrets.resolve(_spec({"sopsFile": NAMED}), tmp_path / "m")
    message = str(caught.value)
    assert "no age key of this node opens it: set SOPS_AGE_KEY_FILE" in message, message
    assert "then restart the daemon: it reads its environment at start" in message, message
    assert "s3cret" not in message


def test_files_root_must_not_trust_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the manifests' rule handed in (the pass does, as root): a file anyone but
    root owns is refused, a sopsFile too (anyone can encrypt for the node's public key),
    naming the file and the fix, never a value. (Not root, the test's own files are no
    root's either.)"""
    key = make_key(tmp_path / "keys")
    folder = tmp_path / "m"
    sops_file = key.encrypt("LD_PRELOAD=/tmp/x.so\n", folder / "secrets" / "x.env")
    node_file = tmp_path / "node.env"
    node_file.write_text("LD_PRELOAD=/tmp/x.so\n")
    node_file.chmod(0o600)
    monkeypatch.setenv("SOPS_AGE_KEY_FILE", str(key.file))
    for path, item, named in (
        (node_file, {"file": str(node_file)}, f"file {node_file} is owned by uid"),
        (sops_file, {"sopsFile": "secrets/x.env"}, "sopsFile secrets/x.env is owned by uid"),
    ):
        if os.geteuid() == 0:
            os.chown(path, 65534, -1)
        with pytest.raises(SecretError) as caught:
            secrets.resolve(_spec(item), folder, security.path_problem)
        message = str(caught.value)
        assert message.startswith(named) and f"chown root {path}" in message, message
        assert "x.so" not in message
        assert secrets.resolve(_spec(item), folder) == {"LD_PRELOAD": "/tmp/x.so"}


def test_an_age_key_others_can_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node's age key opens every sopsFile: readable by others, it is refused as an
    envFrom file would be (sops read it without a word); as root, one another user owns
    too (with the manifests' rule handed in)."""
    key = make_key(tmp_path / "keys")
    key.encrypt("A=s3cret-a\n", tmp_path / "m" / "secrets" / "x.env")
    monkeypatch.setenv("SOPS_AGE_KEY_FILE", str(key.file))
    spec = _spec({"sopsFile": "secrets/x.env"})
    key.file.chmod(0o644)
    with pytest.raises(SecretError) as caught:
        secrets.resolve(spec, tmp_path / "m")
    message = str(caught.value)
    assert f"SOPS_AGE_KEY_FILE={key.file} can be read by others (mode 0644)" in message
    assert f"chmod 600 {key.file}" in message and "s3cret" not in message
    key.file.chmod(0o600)
    assert secrets.resolve(spec, tmp_path / "m") == {"A": "s3cret-a"}
    if os.geteuid() == 0:
        os.chown(key.file, 65534, -1)
    with pytest.raises(SecretError) as caught:
        secrets.resolve(spec, tmp_path / "m", security.path_problem)
    assert "and its owner reads every secret: `chown root" in str(caught.value)
