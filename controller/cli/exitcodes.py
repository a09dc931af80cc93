"""The exit codes of every verb, in one place (sysexits' 64 for usage errors)."""

from __future__ import annotations

EXIT_OK = 0  # done; in sync; everything Ready
EXIT_FAIL = 1  # invalid input, not converged, or failed
EXIT_CHANGES = 2  # `plan`: changes pending
EXIT_USAGE = 64  # bad flags or arguments (EX_USAGE)
