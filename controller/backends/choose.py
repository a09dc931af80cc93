"""Which backend and which device inventory a configuration asks for.

The only place that names a concrete backend: the CLI and the daemon call it and
hand the result to the reconciler, which sees only the ``Backend`` protocol.
"""

from __future__ import annotations

from controller.backends.base import Backend
from controller.core.inventory import Inventory
from controller.store.node import Config


def open_backend(config: Config) -> Backend:
    from controller.backends.local.runtime import LocalBackend

    return LocalBackend(config.state_dir, config.node)


def inventory_for(config: Config) -> Inventory:
    from controller.backends.local import devices

    return devices.resolve(config.devices)
