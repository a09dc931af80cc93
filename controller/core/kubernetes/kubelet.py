"""What the kubelet does to a container's strings before they reach the program. Pure.

The kubelet expands ``$(VAR)`` in a container's ``command``, ``args`` and ``env`` values
(``VAR`` one of the container's variables; an unknown one stays as written) and reads
``$$`` as one ``$``. Locally nothing does: an argv and an environment reach the engine as
the manifest wrote them (``${VAR}``, ``$(date)``, a ``$$`` in a password or a regex pass
as written). So every exported string goes through :func:`literal`, which the kubelet
turns back into the string itself.
"""

from __future__ import annotations

import re

# A `$` the kubelet would read as the start of `$$` or `$(...)`; any other `$` it keeps.
_EXPANDED = re.compile(r"\$(?=[$(])")


def literal(text: str) -> str:
    """``text`` escaped so that the kubelet's expansion yields ``text`` itself.

    Only a ``$`` followed by ``$`` or ``(`` is doubled: the kubelet reads ``$$`` as
    ``$`` and leaves a ``$`` before any other character (or at the end) as it is, so
    ``${HOME}`` and a lone ``$`` stay readable in the output."""
    return _EXPANDED.sub("$$", text)
