"""Fitting the ecosystem: the distribution's identity, --version, shell completion."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import missing
import pytest
from packaging.requirements import Requirement

from controller import __version__

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args], capture_output=True, text=True, timeout=60
    )


def test_the_distribution_is_not_the_strangers_reconcile() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["name"] == "reconcile-engines"
    assert project["project"]["scripts"] == {"reconcile": "controller.cli:entry"}
    assert project["project"]["dynamic"] == ["version"]  # one source: controller.__version__
    assert "setuptools>=77" in project["build-system"]["requires"]
    assert "watchdog>=7,<8" in project["project"]["dependencies"]
    assert "Apache License" in (REPO / "LICENSE").read_text()


@pytest.mark.parametrize("name", ["httptools", "huggingface_hub"])
def test_a_library_we_reach_deep_into_is_capped_and_installed_within_it(name: str) -> None:
    """The gateway's server is built on httptools' parser (gateway/http/server.py); the
    pull leans on huggingface_hub's dry run and error classes, which a major release may
    remove (2.0 did remove APIs): an install must not pick a release nobody has run."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = [Requirement(d) for d in project["project"]["dependencies"]]
    req = next(r for r in wanted if r.name == name)
    assert any(spec.operator in ("<", "<=", "~=", "==") for spec in req.specifier), req
    assert req.specifier.contains(importlib.metadata.version(name)), req


def test_the_plain_install_runs_the_gateway_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop is a plain dependency (issue 41: asyncio's own loop left the gateway at 0.53x
    nginx's throughput, uvloop 0.75x), so the gateway's loop is uvloop's unless told."""
    from controller.gateway.lifecycle import app as fastloop

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = [Requirement(d) for d in project["project"]["dependencies"]]
    req = next(r for r in wanted if r.name == "uvloop")
    assert req.specifier.contains(importlib.metadata.version("uvloop")), req
    monkeypatch.delenv(fastloop.LOOP_ENV, raising=False)
    loop = fastloop.new_loop()
    try:
        assert fastloop.loop_name(loop) == "uvloop"
    finally:
        loop.close()
    monkeypatch.setenv(fastloop.LOOP_ENV, "asyncio")
    loop = fastloop.new_loop()
    try:
        assert fastloop.loop_name(loop) == "asyncio"
    finally:
        loop.close()


def test_no_example_installs_the_strangers_package() -> None:
    for path in [REPO / "README.md", *REPO.glob("examples/**/*"), *REPO.glob("docs/*.md")]:
        if path.is_file():
            text = path.read_text(errors="replace")
            assert "pip install reconcile\n" not in text and "pip install reconcile " not in text
            assert "RECONCILE_PACKAGE: reconcile " not in text, path


def test_version_exits_0_naming_the_distribution() -> None:
    """README: `--version` says which `reconcile` you have; the unrelated project of that
    name on the package index would print a bare version too."""
    result = cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"reconcile {__version__} (reconcile-engines)"


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_parse(shell: str) -> None:
    result = cli("completion", shell)
    assert result.returncode == 0, result.stderr
    assert "status" in result.stdout
    checker = shutil.which(shell)
    if checker is None:
        if shell == "bash":
            pytest.fail("bash is needed to check the bash completion")
        missing.skip(shell, f"apt-get install {shell}")
    check = subprocess.run([checker, "-n"], input=result.stdout, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr


def test_bash_completion_completes_verbs_and_their_flags() -> None:
    script = cli("completion", "bash").stdout

    def complete(*words: str) -> list[str]:
        line = " ".join(["reconcile", *words])
        driver = (
            f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; _reconcile; "
            'printf "%s\\n" "${COMPREPLY[@]}"'
        )
        out = subprocess.run(["bash", "-c", driver], capture_output=True, text=True, check=True)
        return out.stdout.split()

    assert {"status", "statu"} & set(complete("statu")) == {"status"}
    assert "--follow" in complete("logs", "web", "--fol")
    assert complete("completion", "")[:3] == ["bash", "zsh", "fish"]


def test_completion_for_an_unknown_shell_is_a_usage_error() -> None:
    assert cli("completion", "tcsh").returncode == 64
