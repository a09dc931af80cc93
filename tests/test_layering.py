"""The planner stays pure: no I/O module and no clock, directly or through controller modules.

Imports are read with ``ast`` (nothing is executed), and every ``controller`` module a
pure module imports is followed, so an I/O import two hops away is caught too.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "controller"
CORE = PACKAGE / "core"
# Every module under core/, found on disk: a new pure module is checked without a list to keep.
PURE = tuple(
    sorted(
        ".".join(("controller", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(
            ".__init__"
        )
        for p in CORE.rglob("*.py")
    )
)
FORBIDDEN = frozenset({"os", "subprocess", "psutil", "socket", "structlog", "time"})
CLOCK_CALLS = frozenset({"now", "utcnow", "today", "time", "monotonic", "perf_counter"})


# Each check walks the closure of one module: the 126 tests read the same few hundred
# files again and again (~1.5 s a test at load 20, 190 s of the run). A file is parsed
# once a run, the answers kept (the tree does not change under a run).
@functools.cache
def module_file(name: str) -> Path | None:
    parts = name.split(".")[1:]
    base = PACKAGE.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def imports_of(name: str) -> frozenset[str]:
    """Absolute module names ``name`` imports (``from controller import x`` -> controller.x)."""
    path = module_file(name)
    assert path is not None, name
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            for alias in node.names:
                if module_file(f"{base}.{alias.name}") is not None:
                    found.add(f"{base}.{alias.name}")
    return frozenset(found)


def with_parents(name: str) -> list[str]:
    """Importing controller.a.b runs controller/__init__ and controller/a/__init__ first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def closure(name: str) -> dict[str, list[str]]:
    """Every controller module reachable from ``name`` -> the import chain that reaches it."""
    chains = {mod: [mod] for mod in with_parents(name)}
    todo = list(chains)
    while todo:
        current = todo.pop()
        for imported in sorted(imports_of(current)):
            for mod in with_parents(imported):
                if mod.startswith("controller") and mod not in chains and module_file(mod):
                    chains[mod] = [*chains[current], mod]
                    todo.append(mod)
    return chains


@functools.cache
def clock_reads(name: str) -> tuple[str, ...]:
    path = module_file(name)
    assert path is not None
    tree = ast.parse(path.read_text(), str(path))
    return tuple(
        f"{path.name}:{node.lineno}: .{node.func.attr}()"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CLOCK_CALLS
    )


@pytest.mark.parametrize("name", PURE)
def test_pure_modules_import_no_io(name: str) -> None:
    bad = []
    for module, chain in closure(name).items():
        for imported in imports_of(module):
            if imported.split(".")[0] in FORBIDDEN:
                bad.append(f"{' -> '.join(chain)} imports {imported}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", PURE)
def test_pure_modules_read_no_clock(name: str) -> None:
    bad = [hit for module in closure(name) for hit in clock_reads(module)]
    assert not bad, bad


def test_every_core_module_is_checked() -> None:
    assert "controller.core.plan" in PURE and "controller.core.engines.vllm" in PURE
    assert len(PURE) == len(list(CORE.rglob("*.py")))


def test_the_checker_catches_an_io_import() -> None:
    """The checker itself works: the local backend (I/O by design) is flagged."""
    runtime = "controller.backends.local.runtime"
    offenders = {i.split(".")[0] for m in closure(runtime) for i in imports_of(m)}
    assert {"os", "subprocess"} <= offenders
    assert "controller.host.procstat" in closure(runtime)
    assert clock_reads(runtime)


def test_the_executor_sees_only_the_backend_protocol() -> None:
    reached = closure("controller.reconciler.executor")
    assert "controller.reconciler.launcher" in reached  # its process side, checked too
    assert "controller.backends.base" in reached
    assert not [m for m in reached if m.startswith("controller.backends.local")]


def test_the_daemon_carries_no_http_client_and_no_ssl() -> None:
    """http.client pulls in ssl (~6 MB resident): only --metrics-port and the gateway need
    an HTTP library; the daemon's probes speak HTTP/1.0 on a socket. (The daemon validates
    manifests with pydantic, which brings email and _hashlib of its own.)"""
    import subprocess
    import sys

    code = (
        "import sys; import controller.daemon.loop, controller.host.probes; "
        "import controller.cli.main; "
        "bad = [m for m in ('http.client', 'ssl', 'rich', 'aiohttp') if m in sys.modules]; "
        "sys.exit(f'imported: {bad}' if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
