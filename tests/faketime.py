"""libfaketime for tests that step a real daemon's wall clock (docs/design.md, "Clock steps").

Only the processes started with :func:`env` (and their children) see the step; the
kernel's clocks, the monotonic and boot clocks included, are left alone, as NTP leaves them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import missing

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
# libfaketime 0.9.10 answers EINVAL to clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME),
# which Python 3.11's time.sleep calls: this shim, preloaded first, makes the real call
# (the monotonic clock is not faked here). It makes glibc's own pthread_cond_timedwait
# too: libfaketime's reads its clock file (FAKETIME_NO_CACHE) at every timed wait on a
# condition, and Python's GIL is one (each wait for it when threads contend: a gateway
# with a Ready engine spent ~0.2 of a core on that alone). The waits of the processes
# faked here (Python's GIL and locks, libuv's) are on the monotonic clock, which is not
# faked: libfaketime changed nothing in them but their cost.
SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
int clock_nanosleep(clockid_t c, int flags, const struct timespec *t, struct timespec *r) {
    return syscall(SYS_clock_nanosleep, c, flags, t, r) == 0 ? 0 : errno;
}
typedef int (*timedwait)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
static timedwait glibc_timedwait;
__attribute__((constructor)) static void found(void) {
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    glibc_timedwait = (timedwait)dlsym(libc, "pthread_cond_timedwait");  /* its default */
}
int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *t) {
    return glibc_timedwait(c, m, t);
}
"""


def preload(folder: Path) -> str:
    """``LD_PRELOAD`` for a stepped clock: the shim (built in ``folder``), then libfaketime."""
    if not FAKETIME.exists():
        missing.skip(f"libfaketime ({FAKETIME})", "apt-get install faketime libfaketime")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        missing.skip("a C compiler for the clock_nanosleep shim", "apt-get install gcc")
    (folder / "shim.c").write_text(SHIM)
    shim = folder / "shim.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(shim), str(folder / "shim.c"), "-ldl"], check=True
    )
    return f"{shim}:{FAKETIME}"


def env(preloaded: str, clock: Path) -> dict[str, str]:
    """The environment of a process whose wall clock is ``clock``'s offset (``+0``, ``-1h``:
    write the file to step it)."""
    clock.write_text("+0\n")
    return {
        "LD_PRELOAD": preloaded,
        "FAKETIME_TIMESTAMP_FILE": str(clock),
        # The file is re-read at every call (a cache timed on the faked clock outlives a
        # step back: the next step was never read).
        "FAKETIME_NO_CACHE": "1",
        # Timers, and the boot clock, keep real time: only the wall clock steps.
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "NO_FAKE_STAT": "1",  # file times stay real
    }
