"""The gateway process's files in the state dir: who serves, how to reach it, what it owes.

Stdlib, store and host only (no aiohttp): the daemon's keeper and the CLI verbs read
these without paying for the HTTP stack.

```
<state>/gateway/gw-<nonce>.json     one per live gateway process: its identity, address,
                                    settings; removed by a clean exit, left by a crash
<state>/gateway/current.json        the gateway that holds the port now (its nonce...)
<state>/gateway/retire/<n>.json     a stop (the daemon's, a CLI verb's) asks every gateway
                                    to route nothing more to the engine of nonce <n> and
                                    to finish its requests
<state>/gateway/retire/<n>.<g>.done gateway <g> has (or its grace period ran out)
<state>/gateway/passed              touched by the daemon after its first pass
<state>/gateway/stopped             `reconcile gateway stop` asked: nothing starts one
                                    until a start asks again (SIGHUP, a daemon's start,
                                    `gateway restart`); the stopped gateway's file
<state>/gateway/start.lock          held while a gateway starts: a stop waits for it
<state>/gateway/metrics.prom        the current gateway's Prometheus text
<state>/gateway/handed-<nonce>.prom a replaced gateway's final counters, for a successor
<state>/gateway/daemon.sock         the daemon's wake-up socket, or, when the path is too
<state>/gateway/daemon.addr         long for sun_path, the abstract name it bound instead
```

A gateway is known by its pid *and* start time (invariant 6), never by a pid alone,
and carries ``RECONCILE_GATEWAY=<node>/<nonce>`` in its environment (what a sweep
looks for, like an engine's ``RECONCILE_INSTANCE``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.core.state import ProcessRef, Record
from controller.host.procs import process_alive
from controller.store.documents import write_atomic
from controller.store.lock import FileLock
from controller.store.statedir import StateDir

MARKER = "RECONCILE_GATEWAY"
STATE_ID = "RECONCILE_STATE_ID"  # its state dir's id, as its engines carry it (stateid.py)
READY_FD = "RECONCILE_GATEWAY_READY_FD"  # the pipe a starting gateway says "ready" on
VERSION = 1
# sun_path holds 108 bytes on Linux (104 on macOS): a longer path goes to the abstract
# namespace (Linux), where no file permission protects a name: see "the sockets" below.
SUN_PATH_MAX = 100
HANDED = "handed-"  # handed-<nonce>.prom: a replaced gateway's final counters
CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid


def folder(state_dir: Path) -> Path:
    return StateDir(state_dir).gateway


def ensure(state_dir: Path) -> Path:
    StateDir(state_dir).retire.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder(state_dir)


@dataclass(frozen=True, slots=True)
class GatewayInfo:
    """What a gateway process writes about itself (``gw-<nonce>.json``)."""

    nonce: str
    ref: ProcessRef
    host: str
    port: int
    version: str  # reconcile's version
    fingerprint: str  # version + settings + build: a daemon adopts only an equal one
    settings: dict[str, Any]  # what started it (restart starts the same)
    started_at: float
    control: str = ""  # its control socket's address ("": derived from the nonce, as before)
    # Where its spans go ("": none), redacted (a collector's password or token is not
    # kept): traces follow the environment of whoever started it (a daemon, or
    # `reconcile gateway restart` in a shell), so a restart compares them.
    traces: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return process_alive(self.ref)


def fingerprint(settings: dict[str, Any], version: str) -> str:
    """Whom a daemon adopts: a gateway of its version, its settings and its build."""
    text = json.dumps({"settings": settings, "version": version, "build": build()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.cache
def build() -> str:
    """This process's code: each module's path, size and mtime. The version alone never
    changes from a source checkout's upgrade (``git pull``, ``pip install .``): the new
    daemon adopted the old gateway, whose code then served on until a `gateway restart`.
    A reinstall of the same code is a hand-over too, which fails no request."""
    root = Path(__file__).resolve().parents[2]  # controller/
    digest = hashlib.sha256()
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(f for f in files if f.endswith(".py")):
            st = os.stat(os.path.join(folder, name))
            where = os.path.relpath(os.path.join(folder, name), root)
            digest.update(f"{where}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _to_json(info: GatewayInfo) -> bytes:
    ref = info.ref
    data = {
        "version": VERSION,
        "nonce": info.nonce,
        "ref": {
            "pid": ref.pid,
            "start_time": ref.start_time,
            "start_ticks": ref.start_ticks,
            "boot_id": ref.boot_id,
        },
        "host": info.host,
        "port": info.port,
        "reconcile_version": info.version,
        "fingerprint": info.fingerprint,
        "settings": info.settings,
        "started_at": info.started_at,
        "control": info.control,
        "traces": info.traces,
    }
    return json.dumps(data, sort_keys=True).encode()


def _from_json(raw: bytes) -> GatewayInfo | None:
    """A gateway file, or None when torn, foreign or of another version (not ours to use)."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("version") != VERSION:
            return None
        ref = data["ref"]
        ticks = ref.get("start_ticks")
        boot = ref.get("boot_id")
        return GatewayInfo(
            nonce=str(data["nonce"]),
            ref=ProcessRef(
                pid=int(ref["pid"]),
                start_time=float(ref["start_time"]),
                start_ticks=int(ticks) if ticks is not None else None,
                boot_id=str(boot) if boot is not None else None,
            ),
            host=str(data["host"]),
            port=int(data["port"]),
            version=str(data["reconcile_version"]),
            fingerprint=str(data["fingerprint"]),
            settings=dict(data["settings"]),
            started_at=float(data["started_at"]),
            control=str(data.get("control") or ""),
            traces=str(data.get("traces") or ""),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _read(path: Path) -> GatewayInfo | None:
    try:
        return _from_json(path.read_bytes())
    except OSError:
        return None


def member_path(state_dir: Path, nonce: str) -> Path:
    return StateDir(state_dir).gateway_member(nonce)


def register(state_dir: Path, info: GatewayInfo) -> None:
    write_atomic(member_path(state_dir, info.nonce), _to_json(info))


def unregister(state_dir: Path, nonce: str) -> None:
    """A clean exit: the member file goes (a crash leaves it: that is how one is told)."""
    with contextlib.suppress(FileNotFoundError):
        member_path(state_dir, nonce).unlink()
    _forget_reloads(state_dir, nonce)
    current = read_current(state_dir)
    if current is not None and current.nonce == nonce:
        with contextlib.suppress(FileNotFoundError):
            StateDir(state_dir).current_gateway.unlink()


def crashed(state_dir: Path, nonce: str) -> bool:
    """A gateway that is gone but left its member file ended without cleaning up."""
    return member_path(state_dir, nonce).exists()


def forget(state_dir: Path, nonce: str) -> None:
    """What a crashed gateway left: its member file and its control socket's path."""
    with contextlib.suppress(FileNotFoundError):
        member_path(state_dir, nonce).unlink()
    _forget_reloads(state_dir, nonce)
    unlink_address(control_address(state_dir, nonce))


def _forget_reloads(state_dir: Path, nonce: str) -> None:
    """Its count of SIGHUPs answered (reloads.py): nobody waits on a gateway gone."""
    with contextlib.suppress(FileNotFoundError):
        StateDir(state_dir).gateway_reloads(nonce).unlink()


def members(state_dir: Path) -> list[GatewayInfo]:
    """Every gateway file, live or not, oldest first."""
    try:
        paths = sorted(folder(state_dir).glob("gw-*.json"))
    except OSError:
        return []
    found = [info for info in map(_read, paths) if info is not None]
    return sorted(found, key=lambda i: i.started_at)


def live(state_dir: Path) -> list[GatewayInfo]:
    return [info for info in members(state_dir) if info.alive()]


def make_current(state_dir: Path, info: GatewayInfo) -> None:
    write_atomic(StateDir(state_dir).current_gateway, _to_json(info))


def read_current(state_dir: Path) -> GatewayInfo | None:
    """The gateway ``current.json`` names; when the file is there and unreadable (a disk
    error, a hand edit: ``unreadable_current`` says why), the live member that holds the
    port, found from the members' files."""
    info, why = _current(state_dir)
    return port_holder(state_dir) if why is not None else info


def unreadable_current(state_dir: Path) -> str | None:
    """Why ``current.json`` is there and names no gateway; None when it reads or is absent."""
    return _current(state_dir)[1]


def _current(state_dir: Path) -> tuple[GatewayInfo | None, str | None]:
    path = StateDir(state_dir).current_gateway
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path} is unreadable ({exc.strerror or exc})"
    info = _from_json(raw)
    return info, None if info is not None else f"{path} is torn or not a gateway file"


def port_holder(state_dir: Path) -> GatewayInfo | None:
    """The live gateway that holds a listening socket on its port: the newest, as in a
    hand-over both hold the one socket for a moment. None when none does (or no fd of
    theirs is ours to read)."""
    from controller.host import ports  # a torn file's path alone: `status` stays cheap

    for info in reversed(live(state_dir)):
        inodes = {one.inode for one in ports.listeners_on(info.port)}
        if inodes and ports.holds_any(info.ref.pid, inodes):
            return info
    return None


def current_live(state_dir: Path) -> GatewayInfo | None:
    info = read_current(state_dir)
    return info if info is not None and info.alive() else None


def gateway_state_dir(pid: int) -> Path | None:
    """The state dir of the gateway process ``pid`` (its ``--settings``, as the keeper
    starts it), None when ``pid`` is no gateway or is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    if "controller.gateway" not in argv or "--settings" not in argv[:-1]:
        return None
    try:
        where = json.loads(argv[argv.index("--settings") + 1])["state_dir"]
    except (ValueError, KeyError, TypeError):
        return None
    return Path(where) if isinstance(where, str) else None


def gateway_state_id(pid: int) -> str | None:
    """The id of the state dir the gateway process ``pid`` was started for (its
    environment: ``keeper.start_process``); None from a version that did not say, or when
    it cannot be read (gone, another user's)."""
    from controller.host.procscan import environ  # a /proc read: only where asked

    prefix = f"{STATE_ID}=".encode()
    found = next((i for i in (environ(pid) or b"").split(b"\0") if i.startswith(prefix)), None)
    return None if found is None else found[len(prefix) :].decode(errors="replace")


# -- signalling a gateway (by identity) ------------------------------------------------


def signal_gateway(info: GatewayInfo, sig: int) -> bool:
    """Signal the gateway ``info`` names, only if that very process still runs."""
    if not info.alive():
        return False
    try:
        os.kill(info.ref.pid, sig)
    except ProcessLookupError:
        return False
    return True


def stop_all(state_dir: Path, grace: float) -> list[GatewayInfo]:
    """SIGTERM every live gateway of this state dir (each drains, then exits); SIGKILL
    what is left after ``grace`` and a few seconds more. Returns those stopped."""
    found = live(state_dir)
    for info in found:
        signal_gateway(info, signal.SIGTERM)
    deadline = time.monotonic() + grace + 5.0
    while any(i.alive() for i in found) and time.monotonic() < deadline:
        time.sleep(0.02)
    for info in found:
        if signal_gateway(info, signal.SIGKILL):
            forget(state_dir, info.nonce)
    return found


# -- the operator's stop ------------------------------------------------------------------
# A stop wins over the keeper's restarts, as `systemctl stop` over a restart policy: the
# stop writes ``stopped`` and then takes ``start.lock``; a start takes the lock and then
# looks for ``stopped``. So a start under way when the stop came is waited for and
# stopped with the rest; one that comes after it sees the ask and starts nothing.

START_LOCK_WAIT = 25.0  # a start's longest: its answer (20 s), then reaping one that failed


def ask_stopped(state_dir: Path, last: GatewayInfo | None) -> None:
    """``last``: the gateway that served (its settings: `gateway restart` starts one
    again from them, as `systemctl restart` starts a stopped unit); None if none did."""
    write_atomic(StateDir(state_dir).gateway_stopped, _to_json(last) if last else b"{}")


def read_stopped(state_dir: Path) -> GatewayInfo | None:
    """The gateway a stop in force stopped, when it named one."""
    return _read(StateDir(state_dir).gateway_stopped)


def stop_asked(state_dir: Path) -> bool:
    return stopped_since(state_dir) is not None


def stopped_since(state_dir: Path) -> float | None:
    """When the stop in force was asked (its file's time), None when none is."""
    try:
        return StateDir(state_dir).gateway_stopped.stat().st_mtime
    except OSError:
        return None


def clear_stopped(state_dir: Path) -> None:
    """A start asked for (SIGHUP, a daemon's start, `gateway restart`): the stop is over."""
    with contextlib.suppress(FileNotFoundError):
        StateDir(state_dir).gateway_stopped.unlink()


def start_lock(state_dir: Path) -> FileLock:
    return FileLock(StateDir(state_dir).gateway_start_lock, what="gateway start lock")


# -- retiring an engine (the drain before a stop: the daemon's, the CLI's) --------------

DRAIN_SLACK = 2.0  # seconds past the grace period for the gateways' answers (a poll or two)
DRAIN_RESYNC = 0.5  # seconds at most between looks at the answers


def drain(state_dir: Path, old: Record, new: Record | None, wait: Callable[[float], object]
          ) -> bool:  # fmt: skip
    """Every live gateway routes nothing more to ``old`` (``new`` takes its requests) and
    answers once its requests to it ended, or ``old``'s grace period ran out (as a pod's
    endpoints go before its termination grace). ``wait(s)``: block until an answer may
    have come, or ``s`` passed (the keeper's retire/ watch, the CLI's poll). False when
    a live gateway did not answer in time (a gateway that died meanwhile answers nothing)."""
    gateways = live(state_dir)
    if not gateways or old.nonce is None:
        return True
    nonce = old.nonce
    ask_retire(state_dir, nonce, old.name, new.name if new else None, old.grace_seconds)
    try:
        deadline = time.monotonic() + old.grace_seconds + DRAIN_SLACK
        while (remaining := deadline - time.monotonic()) > 0:
            if not _unanswered(state_dir, nonce, gateways):
                return True
            wait(min(DRAIN_RESYNC, remaining))
        return False
    finally:
        drop_retire(state_dir, nonce)


def ask_drain(state_dir: Path, old: Record, new: Record | None) -> list[GatewayInfo]:
    """``drain``'s ask alone, for the daemon's deferred stops: the live gateways asked to
    retire ``old`` (none: no gateway serves, nothing to wait for). Whether each answered
    is ``drain_answered``'s; ``drop_retire`` ends the ask."""
    gateways = live(state_dir)
    if not gateways or old.nonce is None:
        return []
    ask_retire(state_dir, old.nonce, old.name, new.name if new else None, old.grace_seconds)
    return gateways


def drain_answered(state_dir: Path, nonce: str, gateways: list[GatewayInfo]) -> bool:
    """Every gateway ``ask_drain`` asked answered (its requests to the instance ended, or
    its grace ran out), or is gone."""
    return not _unanswered(state_dir, nonce, gateways)


def _unanswered(state_dir: Path, nonce: str, gateways: list[GatewayInfo]) -> bool:
    return any(not ack_path(state_dir, nonce, g.nonce).exists() and g.alive() for g in gateways)


def retire_folder(state_dir: Path) -> Path:
    return StateDir(state_dir).retire


def ask_retire(state_dir: Path, nonce: str, name: str, new: str | None, grace: float) -> None:
    data = {"nonce": nonce, "name": name, "new": new, "grace": grace}
    write_atomic(StateDir(state_dir).retire_ask(nonce), json.dumps(data).encode())


def retire_asked(state_dir: Path, nonce: str) -> bool:
    """An ask to retire the instance ``nonce`` stands (``drop_retire`` has not ended it)."""
    return StateDir(state_dir).retire_ask(nonce).exists()


@dataclass(frozen=True, slots=True)
class RetireAsk:
    nonce: str
    name: str  # the old instance's record
    new: str | None  # the record that takes its requests (a RollingUpdate's @next)
    grace: float


def retire_asks(state_dir: Path) -> list[RetireAsk]:
    out: list[RetireAsk] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(retire_folder(state_dir)):
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                data = json.loads(Path(entry.path).read_bytes())
                new = data.get("new")
                out.append(
                    RetireAsk(
                        nonce=str(data["nonce"]),
                        name=str(data["name"]),
                        new=str(new) if new is not None else None,
                        grace=float(data["grace"]),
                    )
                )
    return out


def ack_path(state_dir: Path, nonce: str, gateway: str) -> Path:
    return StateDir(state_dir).retire_ack(nonce, gateway)


def ack_retire(state_dir: Path, nonce: str, gateway: str) -> None:
    write_atomic(ack_path(state_dir, nonce, gateway), b"")


def drop_retire(state_dir: Path, nonce: str) -> None:
    """The request and every answer to it (the daemon's, once its drain is over)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(retire_folder(state_dir)):
            if entry.name.startswith(f"{nonce}."):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def clear_retires(state_dir: Path, keep: set[str]) -> None:
    """A daemon starting: no drain of an earlier one is still waiting (one daemon per
    state dir, the lock says so), so what such a drain asked is void, but for the asks
    (and their answers) of the instances ``keep`` names, which this daemon takes over."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(retire_folder(state_dir)):
            if entry.name.partition(".")[0] in keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


# -- the daemon's first pass, the metrics text -------------------------------------------


def passed_path(state_dir: Path) -> Path:
    return StateDir(state_dir).passed


def mark_passed(state_dir: Path) -> None:
    write_atomic(passed_path(state_dir), str(os.getpid()).encode())


def passed_since(state_dir: Path, since: float) -> bool:
    try:
        return passed_path(state_dir).stat().st_mtime >= since
    except OSError:
        return False


def log_path(state_dir: Path) -> Path:
    """Where a gateway started by ``reconcile gateway restart`` writes its log lines."""
    return StateDir(state_dir).gateway_log


def metrics_path(state_dir: Path) -> Path:
    return StateDir(state_dir).gateway_metrics


def handed_path(state_dir: Path, nonce: str) -> Path:
    """Where the gateway ``nonce``, replaced, leaves its final counters (a successor
    claims them, ``claim_handed``)."""
    return folder(state_dir) / f"{HANDED}{nonce}.prom"


def claim_handed(state_dir: Path, nonce: str) -> str | None:
    """The final counters gateway ``nonce`` left, taken: the file is read, then removed,
    and only the caller whose removal succeeded gets the text; None when there is none
    (not written yet, or another gateway took it). An unreadable file is removed and
    its error raised (OSError, UnicodeDecodeError): nobody adds it."""
    path = handed_path(state_dir, nonce)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    try:
        path.unlink()  # written once, never again: whoever removes it adds it
    except FileNotFoundError:
        return None
    return text


def sweep_handed(state_dir: Path, me: str) -> None:
    """Remove the final counters nobody will add (their successor died before it took
    them), while gateway ``me`` is the only one live: any other may still wait for one."""
    if any(info.nonce != me for info in live(state_dir)):
        return
    with contextlib.suppress(OSError):
        for path in folder(state_dir).glob(f"{HANDED}*.prom"):
            if path.name[len(HANDED) : -len(".prom")] != me:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def metrics_text(state_dir: Path) -> str:
    """The current gateway's metrics, for the daemon's /metrics and textfile ("" before
    the gateway's first write)."""
    try:
        text = metrics_path(state_dir).read_text()
    except (OSError, UnicodeDecodeError):
        return ""
    return text if text.endswith("\n") else ""  # never half a line (writes are atomic)


def metrics_file(state_dir: Path) -> tuple[str, float]:
    """The current gateway's metrics file and when the gateway last wrote or confirmed
    it (its mtime: a gateway touches it when the text is unchanged); ("", 0) without one."""
    path = metrics_path(state_dir)
    try:
        at = path.stat().st_mtime
    except OSError:
        return "", 0.0
    text = metrics_text(state_dir)
    return text, at if text else 0.0


# -- the sockets: the daemon's wake-up, each gateway's control ---------------------------
#
# A socket's path in the state dir is as private as the state dir. A path too long for
# sun_path goes to Linux's abstract namespace instead, where any user may bind a name
# or send to one. So such a name is drawn at random when it is bound (nobody can take
# it first: nobody knows it before) and written down in the state dir (the daemon's in
# ``daemon.addr``, a gateway's in its member file); and every end checks the other's
# credentials: only our uid or root may wake the daemon, talk to a gateway, or answer
# as one.


def unix_address(state_dir: Path, name: str) -> str:
    """``<state>/gateway/<name>`` when it fits in sun_path, else the abstract name the
    state dir once derived (Linux; a leading NUL): where a gateway that wrote no
    ``control`` address listens."""
    path = folder(state_dir) / name
    if _fits(path):
        return str(path)
    digest = hashlib.sha256(os.fsencode(state_dir.absolute())).hexdigest()[:24]
    return f"\0reconcile-{digest}-{name}"


def fresh_address(state_dir: Path, name: str) -> str:
    """Where to bind socket ``name`` now: its path when it fits in sun_path, else an
    abstract name drawn at random (one derived from the path could be squatted)."""
    path = folder(state_dir) / name
    return str(path) if _fits(path) else f"\0reconcile-{os.urandom(16).hex()}-{name}"


def _fits(path: Path) -> bool:
    return len(os.fsencode(path)) <= SUN_PATH_MAX or not sys.platform.startswith("linux")


def wake_address(state_dir: Path) -> str | None:
    """The daemon's wake-up socket: the abstract name it wrote down, else its path;
    None when its path does not fit and no daemon wrote a name (nobody to wake)."""
    try:
        return "\0" + StateDir(state_dir).wake_name.read_text().removeprefix("@")
    except (OSError, UnicodeDecodeError):
        path = StateDir(state_dir).daemon_socket
        return str(path) if _fits(path) else None


def publish_wake(state_dir: Path, address: str) -> None:
    """Write down the daemon's abstract wake-up name (a path needs no note)."""
    if address.startswith("\0"):
        write_atomic(StateDir(state_dir).wake_name, ("@" + address[1:]).encode())


def unpublish_wake(state_dir: Path, address: str) -> None:
    if wake_address(state_dir) == address:
        with contextlib.suppress(FileNotFoundError):
            StateDir(state_dir).wake_name.unlink()


def control_address(state_dir: Path, nonce: str) -> str:
    return unix_address(state_dir, f"ctl-{nonce}.sock")


def control_of(state_dir: Path, info: GatewayInfo) -> str:
    """Where gateway ``info`` answers: the address it wrote down, else the derived one."""
    return info.control or control_address(state_dir, info.nonce)


def unlink_address(address: str) -> None:
    if not address.startswith("\0"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)


def wake_daemon(sock: socket.socket, address: str | None) -> None:
    """Ask the daemon for a pass; nobody listening (no daemon now) is fine: the next
    daemon's first pass reads what the gateway wrote."""
    if address is not None:
        with contextlib.suppress(OSError):
            sock.sendto(b"!", address)


def trusted(uid: int | None) -> bool:
    """A peer we take orders from (or answers of): our own uid or root. ``None`` (no
    credentials on this system) is trusted: there the socket's 0700 folder is the check."""
    return uid is None or uid in (0, os.getuid())


def trusted_peer(conn: socket.socket) -> bool:
    """The peer of a unix stream connection is trusted (Linux ``SO_PEERCRED``)."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return True
    _pid, uid, _gid = CREDS.unpack(conn.getsockopt(socket.SOL_SOCKET, opt, CREDS.size))
    return trusted(uid)


def pass_credentials(sock: socket.socket) -> None:
    """Have the kernel attach each datagram's sender (``sender_uid``) where it can."""
    if hasattr(socket, "SO_PASSCRED"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)


def receive(sock: socket.socket) -> int | None:
    """One datagram off ``sock`` (``BlockingIOError`` when none): its sender's uid, or
    None when the system gives no credentials."""
    if not hasattr(socket, "SCM_CREDENTIALS"):
        sock.recv(64)
        return None
    _data, ancillary, _flags, _addr = sock.recvmsg(64, socket.CMSG_SPACE(CREDS.size))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return int(CREDS.unpack(data[: CREDS.size])[1])
    return -1  # credentials asked for and missing: not ours to trust
