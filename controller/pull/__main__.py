"""``python -m controller.pull``: the pull process a pass starts (see worker.py).

The job comes in ``RECONCILE_PULL_JOB`` (launch.py), not the argv: a URL's token must
not show in `ps`. A JSON argument is still read (by hand, for a look at one pull).
"""

from __future__ import annotations

import os
import sys

from controller.pull.job import JOB_ENV, Job
from controller.pull.statewatch import StateWatch
from controller.pull.worker import run


def main(argv: list[str]) -> int:
    text = argv[0] if len(argv) == 1 else os.environ.get(JOB_ENV) if not argv else None
    if not text:
        print(
            f"usage: {JOB_ENV}=JOB_JSON python -m controller.pull (started by reconcile)",
            file=sys.stderr,
        )
        return 64
    job = Job.from_json(text)
    watch = StateWatch.of(job)
    if not watch.holds():  # it said why, in the pull's log
        return 1
    return run(job, watch)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # At once: a hub download stopped by its guard (hubfetch.Guard) may leave the
    # library's download threads running, which a normal exit would wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
