"""What a failed image pull's message says to a wait: whether retrying can fix it; and
what a start waiting for its image may do meanwhile (``ImageWait``). Pure.

The local backend writes the message (``cannot pull image IMAGE: <the runtime's words>;
<the next move>``); ``--wait`` reads it from the record to decide whether to wait on.
"""

from __future__ import annotations

from dataclasses import dataclass

FAILED = "cannot pull image "  # how a record's message of a failed image pull begins
# The runtime's words for a pull no retry fixes (podman's and docker's): a name, tag or
# digest no registry has, or no access. A registry down, a DNS or TLS error may pass.
FINAL_WORDS = (
    "manifest unknown",
    "name unknown",
    "not found",
    "unauthorized",
    "denied",
    "authentication required",
    "no basic auth credentials",
    "invalid reference format",
)
# A running engine kept for a new spec whose image did not pull: how its why ends while
# the pull is tried again, and what it says where pullPolicy Never forbids a pull.
RETRYING = "; pulling it again"
NEVER = "pullPolicy is Never"


@dataclass(frozen=True, slots=True)
class ImageWait:
    """Why a deployment's starts wait for their image (``Observed.fetching``), and how
    many of them may be placed meanwhile (``room``): a cluster's nodes with room that hold
    it take that many, into their free room alone; the others wait, as they may land only
    by preempting, where a node lacks it. One node: 0 (there or not, for every start)."""

    why: str
    room: int = 0


def failed(message: str) -> bool:
    return message.startswith(FAILED)


def final(message: str) -> bool:
    """A failed image pull whose runtime's words say that retrying cannot fix it."""
    said = message.lower()
    return failed(message) and any(words in said for words in FINAL_WORDS)


def kept_for_good(why: str, retried: bool) -> bool:
    """A running engine kept for its new spec (``why``) that no further wait brings: its
    image's pull failed for good (no retry fixes it, or ``retried`` failed too), or Never
    forbids one. Its retry under way (``RETRYING``) may yet bring it."""
    if why.endswith(RETRYING):
        return False
    if NEVER in why:
        return True
    return failed(why) and (retried or final(why))
