"""What the driver and an engine's actor both read, beside the job and the status: the
words a status starts with that the driver acts on, and the node's folder of a namespace.

Light (no ``ray``, nothing of the engine's): the driver process imports it at every start.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

MISSING_MODEL = "the model files"  # how a status says the node lacks them (the driver forgets it)
PULLING_IMAGE = "pulling image"  # how the container wrapper says its image is on its way


def node_root(state_key: str) -> Path:
    """This node's folder of our namespace (made here): the engines' logs, and the
    container wrapper's state (its image pulls: ``imagefetch.py`` reads them too)."""
    root = Path(tempfile.gettempdir()) / "reconcile-ray" / state_key
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return root
