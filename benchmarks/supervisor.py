"""supervisord as the alternative: a config per run, programs in ``conf.d``, its log parsed.

supervisord does not watch a folder: its users drop a program file into ``conf.d``
and run ``supervisorctl update``, so that is the "file dropped" path measured here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from benchmarks import common
from benchmarks.common import PYTHON, engine_argv, read_execs, stop, wait_for

LOG_RESOLUTION = 0.001  # seconds
EXITED = re.compile(r"^(\S+ \S+) [A-Z]+ exited: (\S+) ")


def available() -> bool:
    return Path(PYTHON).with_name("supervisord").exists()


def program(name: str, port: int, exec_log: Path) -> str:
    command = " ".join(engine_argv(str(port)))
    return (
        f"[program:{name}]\n"
        f"command={command}\n"
        f'environment=BENCH_EXEC_LOG="{exec_log}",BENCH_NAME="{name}"\n'
        "autostart=true\nautorestart=true\nstartsecs=0\nstartretries=1000\n"
        "stopasgroup=true\nkillasgroup=true\nstopwaitsecs=2\n"
        "stdout_logfile=NONE\nstderr_logfile=NONE\n"
    )


@dataclass
class Supervisor:
    root: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def conf(self) -> Path:
        return self.root / "supervisord.conf"

    @property
    def programs(self) -> Path:
        return self.root / "conf.d"

    @property
    def log(self) -> Path:
        return self.root / "supervisord.log"

    @property
    def exec_log(self) -> Path:
        return self.root / "exec.log"

    def write_conf(self) -> None:
        self.programs.mkdir(exist_ok=True)
        sock = self.root / "supervisor.sock"
        self.conf.write_text(
            "[supervisord]\n"
            f"nodaemon=true\nlogfile={self.log}\npidfile={self.root / 'supervisord.pid'}\n"
            "loglevel=info\n\n"
            f"[unix_http_server]\nfile={sock}\n\n"
            f"[supervisorctl]\nserverurl=unix://{sock}\n\n"
            "[rpcinterface:supervisor]\n"
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n\n"
            f"[include]\nfiles = {self.programs}/*.conf\n"
        )

    def add(self, name: str, port: int) -> Path:
        path = self.programs / f"{name}.conf"
        path.write_text(program(name, port, self.exec_log))
        return path

    def start(self) -> subprocess.Popen[bytes]:
        self.proc = subprocess.Popen(
            [str(Path(PYTHON).with_name("supervisord")), "-c", str(self.conf)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self.proc

    def wait_up(self) -> None:
        wait_for(lambda: (self.root / "supervisor.sock").exists(), 30, "supervisord's socket")

    def ctl(self, *args: str) -> None:
        ctl = str(Path(PYTHON).with_name("supervisorctl"))
        subprocess.run(
            [ctl, "-c", str(self.conf), *args],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )

    def exits(self) -> dict[str, list[float]]:
        """Program name -> wall-clock times supervisord logged its exits."""
        out: dict[str, list[float]] = {}
        with contextlib.suppress(FileNotFoundError):
            for line in self.log.read_text().splitlines():
                m = EXITED.match(line)
                if m:
                    when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    # supervisord truncates its log times to the millisecond ('%03d'):
                    # the unbiased estimate of when it logged is half a millisecond on.
                    out.setdefault(m.group(2), []).append(when + LOG_RESOLUTION / 2)
        return out

    def close(self) -> None:
        if self.proc is not None:
            stop(self.proc, signal.SIGTERM, timeout=15)
        # Anything it left (it should leave nothing): the engines we saw start.
        for ex in read_execs(self.exec_log):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if _is_engine(ex.pid):
                    os.kill(ex.pid, signal.SIGKILL)


def _is_engine(pid: int) -> bool:
    try:
        return b"engine.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@contextlib.contextmanager
def supervisor(tag: str) -> Iterator[Supervisor]:
    root = Path(tempfile.mkdtemp(prefix=f"reconcile-bench-sv-{tag}-"))
    sv = Supervisor(root)
    sv.write_conf()
    try:
        yield sv
    finally:
        sv.close()
        time.sleep(0.05)
        common.keep_logs(root, f"supervisord-{tag}-{root.name.rsplit('-', 1)[-1]}")
        shutil.rmtree(root, ignore_errors=True)
