"""Fitting the ecosystem: the distribution's identity, --version, shell completion."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tomllib
import zipfile
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


def _built(kind: str, tmp_path: Path) -> tuple[Path, zipfile.ZipFile]:
    """The distribution's wheel (``wheel``) or editable wheel (``editable``), built by
    setuptools from a copy of what a clean checkout ships (so nothing is written here)."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, source / name)
    junk = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "controller", source / "controller", ignore=junk)
    out = tmp_path / "out"
    build = f"from setuptools import build_meta as b; print(b.build_{kind}({str(out)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", build], cwd=source, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return source, zipfile.ZipFile(out / done.stdout.splitlines()[-1])


def test_the_editable_install_is_a_path_entry_not_an_import_hook(tmp_path: Path) -> None:
    """`pip install -e .` (README's commands, .ci/run) put setuptools' import hook in every
    Python process of the venv when the layout did not look simple to it: ~15 ms of CPU a
    start (its pathlib, importlib.util and fnmatch imports), ~3,000 starts a test run.
    package-dir's "" = "." makes the flat layout plain: one .pth line, the checkout."""
    source, wheel = _built("editable", tmp_path)
    names = wheel.namelist()
    pths = [n for n in names if n.endswith(".pth")]
    assert len(pths) == 1 and not [n for n in names if n.endswith(".py")], names
    assert Path(wheel.read(pths[0]).decode().strip()).resolve() == source.resolve()


def test_the_wheel_ships_the_package_its_data_and_nothing_beside_it(tmp_path: Path) -> None:
    """package-dir's "" = "." (the editable install's path entry) changes nothing that
    `pip install .` installs: only `controller`, with the web page's files and py.typed."""
    source, wheel = _built("wheel", tmp_path)
    names = wheel.namelist()
    info = f"reconcile_engines-{__version__}.dist-info"
    assert {n.split("/")[0] for n in names} == {"controller", info}, names
    shipped = {n for n in names if n.startswith("controller/")}
    here = {
        p.relative_to(source).as_posix()
        for p in (source / "controller").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert shipped == here, sorted(shipped ^ here)
