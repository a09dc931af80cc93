"""Strict modes when running as root (cron's crontab checks, sshd's ``StrictModes``).

A manifest says what command to run, so when reconcile runs as root whoever can
write a manifest (or its folder) can run any command as root. As root, a manifest
or a manifests folder that is group- or world-writable, or owned by anyone but
root, is refused with a message saying how to fix it; ``--insecure-manifests``
turns the check off. The state dir holds records and logs that root writes, so it
and its folders must be root's too, a symlink among them as well as what it names
(no opt-out: ``chown`` it). A gateway's API-keys file decides who may use it: as root,
it must be root's too.

Refusing a manifest never stops its deployments: the file is reported like an
unreadable one, its engines keep running and ``status`` marks their spec invalid.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from controller.errors import ConfigError
from controller.errors import InsecureManifest as InsecureManifest  # re-exported

OPT_OUT = "--insecure-manifests"


def strict(insecure: bool = False) -> bool:
    """Whether the checks apply: running as root and not opted out."""
    return os.geteuid() == 0 and not insecure


def problem(info: os.stat_result) -> str | None:
    """Why root must not trust a file or folder with this stat, or None."""
    if info.st_uid != 0:
        return f"owned by uid {info.st_uid}, not root"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"group- or world-writable (mode {stat.filemode(info.st_mode)})"
    return None


def path_problem(path: Path) -> str | None:
    """Why root must not trust ``path``: the symlink itself (whoever owns a link decides
    where it points), then what it names. None when it is missing or trusted."""
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            if info.st_uid != 0:
                return f"a symlink owned by uid {info.st_uid}, not root"
            info = os.stat(path)
    except FileNotFoundError:
        return None
    return problem(info)


def check_manifest(info: os.stat_result) -> None:
    """Raise :class:`InsecureManifest` for a file (or folder) root must not trust."""
    reason = problem(info)
    if reason is not None:
        raise InsecureManifest(
            f"refused: {reason}, so whoever can write it could run any command as root. "
            f"Fix it (chown root, chmod go-w) or pass {OPT_OUT}"
        )


def check_folder(folder: Path) -> None:
    """The folder a manifests ``-f`` names (its target, when it is a symlink)."""
    try:
        info = os.stat(folder)
    except OSError:
        return  # missing or unlistable: the loader reports that in its own words
    check_manifest(info)


def check_state_dir(folders: Iterable[Path]) -> None:
    """As root, every state folder must be root's alone: its records and logs are trusted."""
    if os.geteuid() != 0:
        return
    for folder in folders:
        reason = path_problem(folder)
        if reason is not None:
            raise ConfigError(
                f"state folder {folder} is {reason}: whoever can write it could make "
                f"reconcile (root) overwrite files through it. Run `chown -R root {folder}` "
                f"and `chmod 700 {folder}`, or use another --state-dir"
            )
