"""The command line. ``entry`` is the command's start (``[project.scripts]``, ``__main__``)."""

from __future__ import annotations


def entry() -> None:
    """Run the command; Ctrl-C while Python still imports it exits 130 without a traceback.

    ``main`` answers Ctrl-C itself once it runs, but its imports take a moment first: a Ctrl-C
    pressed at once (a typo seen as Enter went down) printed importlib's stack.
    """
    import sys

    try:
        from controller.cli.main import main

        code = main()
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
