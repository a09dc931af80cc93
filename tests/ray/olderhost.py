"""An engine's actor as an older reconcile placed it, as a driver of this one sees it.

Ray keeps an actor's class with its methods by name, and the CLI's driver cannot load this
one (this folder is not on its path), as it cannot load an ``EngineHost`` whose methods
were others (before ``nodeengine.py``): Ray hands it methods that take keywords only. The
actor itself runs as ours does: its worker is given this folder (``WORKER_ENV``).
"""

from __future__ import annotations

import os
from pathlib import Path

from controller.backends.ray.actor import EngineHost

HERE = Path(__file__).parent
PATH = [str(HERE), os.environ.get("PYTHONPATH", ""), str(HERE.parents[1])]
WORKER_ENV = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in PATH if p)}}


class OlderHost(EngineHost):
    """``EngineHost`` under a name only the test's workers can import."""
