"""Decrypting a ``sopsFile`` with the real ``sops -d`` and the node's age key
(``SOPS_AGE_KEY_FILE``, inherited from reconcile's environment), its output read from a
pipe, in memory; and saying why it failed in our words, never sops' own, which may quote
a line of the file (a value typed in by hand is quoted whole).

``what``: the file as the manifest wrote it (``sopsFile secrets/hf.env``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SOPS_TIMEOUT = 30.0  # seconds: a local decryption; a hung sops must not hang a pass


class SopsError(ValueError):
    """The file could not be decrypted: the whole message, naming it, never a value;
    ``on_node``: the fix is on this node (sops, the age key), not in the file;
    ``no_key``: why no key here opens it (none set, not a recipient), else empty: where
    none is expected (a CI job's `plan`) its values are unknown, not wrong."""

    def __init__(self, message: str, *, on_node: bool = False, no_key: str = "") -> None:
        super().__init__(message)
        self.on_node = on_node
        self.no_key = no_key


def decrypt(path: Path, what: str) -> str:
    """``sops -d``'s output through a pipe: the clear text never touches a disk."""
    argv = ["sops", "--decrypt", "--output-type", "dotenv"]
    if path.suffix not in (".yaml", ".yml", ".json", ".ini"):
        argv += ["--input-type", "dotenv"]  # sops guesses by suffix; hf.env and hf alike
    try:
        done = subprocess.run(
            [*argv, str(path)], capture_output=True, timeout=SOPS_TIMEOUT, check=False
        )
    except FileNotFoundError:
        raise SopsError(
            f"{what}: the sops program is not on PATH (install sops on this node)", on_node=True
        ) from None
    except subprocess.TimeoutExpired:
        raise SopsError(f"{what}: sops -d ran over {SOPS_TIMEOUT:.0f} s", on_node=True) from None
    if done.returncode != 0:
        why, on_node = _why(done.stderr)
        no_key = _no_key(done.stderr)
        raise SopsError(f"{what} cannot be decrypted: {why}", on_node=on_node, no_key=no_key)
    return done.stdout.decode("utf-8", errors="replace")


# sops' words for each failure, and ours: what is wrong and the next move. Its own text is
# never shown (it quotes a hand-edited value, which may be the secret itself).
_EDITED = (
    "it was changed outside sops ({what}): edit it with `sops FILE`, or encrypt it again "
    "from the clear copy (sops -e)"
)
_SOPS_SAYS = (
    ("metadata not found", "it is not SOPS-encrypted (encrypt it: sops -e -i FILE)"),
    ("MAC mismatch", _EDITED.format(what="its MAC does not match its values")),
    ("does not match sops' data format", _EDITED.format(what="a value is not sops' ENC[...]")),
    # AES-GCM's check of one value (sops quotes no value here): a hand edit, a bad merge
    ("message authentication failed", _EDITED.format(what="a value does not decrypt")),
    (
        "cannot use complex value",
        "it holds a nested value (a map or a list): envFrom takes flat KEY: value pairs",
    ),
)
_NO_DATA_KEY = "Failed to get the data key"  # every way the age key failed says this
_UNKNOWN = (
    "sops -d failed (its words are not shown: they may quote the file): run `sops -d FILE` "
    "as reconcile's user to see why"
)


def _why(stderr: bytes) -> tuple[str, bool]:
    """sops' failure in our words (its own may quote a line of the file, so never shown),
    and whether its fix is on this node rather than in the file."""
    text = stderr.decode("utf-8", errors="replace")
    for words, reason in _SOPS_SAYS:
        if words in text:
            return reason, False
    if _NO_DATA_KEY not in text:
        return _UNKNOWN, True  # not a key problem: saying one would send its reader astray
    key = os.environ.get("SOPS_AGE_KEY_FILE")
    if not key:
        empty = "" if key is None else " (SOPS_AGE_KEY_FILE is empty: set to nothing)"
        return (  # a running daemon never sees a variable set after its start
            f"no age key of this node opens it{empty}: set SOPS_AGE_KEY_FILE to the node's key "
            "file (age-keygen makes one; encrypt for its public key) in reconcile's "
            "environment (a unit's Environment=, a crontab's line), then restart the "
            "daemon: it reads its environment at start, a reload (SIGHUP) does not"
        ), True
    problem = _key_problem(key, text)
    if problem is not None:
        return problem, True
    return (  # the file is encrypted for other keys: it is encrypted again, and pushed
        f"this node's age key (SOPS_AGE_KEY_FILE={key}) is not one of its recipients: "
        f"encrypt it again for this node's public key (`age-keygen -y {key}` prints it)"
    ), False


def _no_key(stderr: bytes) -> str:
    """Why no age key here opens the file, in a few words, when that is all that failed
    (SOPS_AGE_KEY_FILE unset, or its key not among the file's recipients); else empty.
    A key file that is missing or unreadable is a fault to fix, not an absent key."""
    text = stderr.decode("utf-8", errors="replace")
    if _NO_DATA_KEY not in text or any(words in text for words, _ in _SOPS_SAYS):
        return ""
    key = os.environ.get("SOPS_AGE_KEY_FILE")
    if not key:
        return _unset(key)
    if _key_problem(key, text) is not None:
        return ""
    return f"the age key SOPS_AGE_KEY_FILE={key} is not one of its recipients"


def _key_problem(key: str, text: str) -> str | None:
    """What is wrong with the key file itself, when sops could not use it."""
    where = f"the age key file SOPS_AGE_KEY_FILE={key}"
    if os.path.isdir(key):
        return (
            f"{where} is a folder: point SOPS_AGE_KEY_FILE at the key file itself "
            "(`age-keygen -o FILE` makes one; encrypt for its public key)"
        )
    if not os.path.isfile(key):
        return (
            f"{where} does not exist on this node: point SOPS_AGE_KEY_FILE at the node's "
            "key file (`age-keygen -o FILE` makes one; encrypt for its public key)"
        )
    if "failed to open SOPS_AGE_KEY_FILE" in text:
        return f"{where} cannot be read by reconcile's user: give that user read access"
    if "failed to parse 'SOPS_AGE_KEY_FILE'" in text:
        return (
            f"{where} holds no age key (an AGE-SECRET-KEY-1... line, as `age-keygen -o "
            "FILE` writes): point SOPS_AGE_KEY_FILE at the node's key file"
        )
    return None


def _unset(key: str | None) -> str:
    """No key file named: unset, or set to nothing (``Environment=SOPS_AGE_KEY_FILE=``, a
    CI job's secret that a fork's pull request is not given), which sops reads as the
    file "" and fails on; to the node both are "no key here", never a missing file."""
    return "SOPS_AGE_KEY_FILE is unset" if key is None else "SOPS_AGE_KEY_FILE is empty"
