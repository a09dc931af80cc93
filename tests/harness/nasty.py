"""Files no manifest folder should hold, each made for real on disk.

``plant(folder)`` writes them all and returns their names. Run as root, a
``chmod 000`` file is still readable, so "unreadable" also comes as what root
cannot read either: a directory, a FIFO, a socket, a broken symlink, a symlink
loop, a character device, and ``/proc/self/mem`` (whose read fails with EIO).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

MB = 1 << 20

BOMB = (
    "a: &a [x,x,x,x,x,x,x,x,x]\n"
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "h: [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
)

VALID_HEAD = "apiVersion: reconcile/v1\nkind: Deployment\nmetadata:\n  name: cut\nspec:\n"


def _text(text: str) -> Callable[[Path], None]:
    return lambda p: p.write_text(text)


def _bytes(data: bytes) -> Callable[[Path], None]:
    return lambda p: p.write_bytes(data)


def _big(p: Path) -> None:
    with open(p, "wb") as f:
        f.truncate(10 * MB)  # 10 MB of NULs: refused by its size, never read


def _loop(p: Path) -> None:
    other = p.with_name(p.name + ".other")
    other.symlink_to(p.name)
    p.symlink_to(other.name)


def _socket(p: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(p))
    sock.close()


def _locked(p: Path) -> None:
    p.write_text("kind: [unterminated\n")
    p.chmod(0)


MAKERS: dict[str, Callable[[Path], None]] = {
    "ten-megabytes.yaml": _big,
    "alias-bomb.yaml": _text(BOMB),
    "deep-nesting.yaml": _text("[" * 100_000),
    "wide-flow.yaml": _text("[" + "0," * (MB // 2 - 8) + "0]"),
    "many-documents.yaml": _text("---\n" * (MB // 4 - 4)),
    "many-keys.yaml": _text("".join(f"k{i}: {i}\n" for i in range(90_000))),
    "not-utf8.yaml": _bytes(VALID_HEAD.encode() + b"  engine: \xff\xfe\xfa\n"),
    "binary.yaml": _bytes(bytes(range(256)) * 8),
    "nul-bytes.yaml": _bytes(VALID_HEAD.encode() + b"  engine: com\x00mand\n"),
    "truncated.yaml": _text(VALID_HEAD + "  engine: command\n  command: [python3, -m, http"),
    "python-tag.yaml": _text("!!python/object/apply:os.system ['touch /tmp/reconcile-pwned']\n"),
    "merge-key.yaml": _text("base: &b {engine: command}\nspec:\n  <<: *b\n"),
    "duplicate-key.yaml": _text(VALID_HEAD.replace("kind: Deployment\n", "kind: Deployment\n" * 2)),
    "tabs.yaml": _text("apiVersion: reconcile/v1\nkind: Deployment\nmetadata:\n\tname: tab\n"),
    "huge-port.yaml": _text(
        VALID_HEAD.replace("cut", "huge") + f"  engine: ollama\n  port: {10**100}\n"
    ),
    "scalar.yaml": _text("just a string\n"),
    "memory-float.yaml": _text(
        VALID_HEAD.replace("cut", "floaty")
        + "  engine: command\n  command: [sleep, '9']\n"
        + "  devices: {count: 1, kind: nvidia, memory: 1.5}\n"
    ),
    "memory-map.yaml": _text(
        VALID_HEAD.replace("cut", "mappy")
        + "  engine: command\n  command: [sleep, '9']\n  devices: {memory: {a: .inf}}\n"
    ),
    "link-out-of-folder.yaml": lambda p: p.symlink_to("/etc/passwd"),
    "a-directory.yaml": lambda p: p.mkdir(),
    "a-fifo.yaml": lambda p: os.mkfifo(p),
    "a-socket.yaml": _socket,
    "broken-link.yaml": lambda p: p.symlink_to("/nonexistent/reconcile/manifest.yaml"),
    "symlink-loop.yaml": _loop,
    "char-device.yaml": lambda p: p.symlink_to("/dev/zero"),
    "proc-mem.yaml": lambda p: p.symlink_to("/proc/self/mem"),
    "mode-000.yaml": _locked,
}


def plant(folder: Path) -> list[str]:
    """Write every nasty file into ``folder``; their names."""
    for name, make in MAKERS.items():
        make(folder / name)
    return list(MAKERS)


def clear(folder: Path) -> None:
    for name in MAKERS:
        for path in (folder / name, folder / f"{name}.other"):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            elif path.is_symlink() or path.exists():
                path.unlink()
