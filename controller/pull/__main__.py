"""``python -m controller.pull JOB``: the pull process a pass starts (see worker.py)."""

from __future__ import annotations

import sys

from controller.pull.job import Job
from controller.pull.worker import run


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m controller.pull JOB_JSON (started by reconcile)", file=sys.stderr)
        return 64
    return run(Job.from_json(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
