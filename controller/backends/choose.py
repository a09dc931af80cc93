"""Which backend and which device inventory a configuration asks for.

The only place that names a concrete backend: the CLI and the daemon call it and
hand the result to the reconciler, which sees only the ``Backend`` protocol. The
ray backend (and ``ray`` itself) is imported only when it is chosen.
"""

from __future__ import annotations

from controller.backends.base import Backend
from controller.core.devices.inventory import Inventory
from controller.core.manifest.backendnames import RAY
from controller.errors import ConfigError
from controller.store.config.node import Config
from controller.store.instances.records import RecordStore


def _need_ray() -> None:
    """Ray is an optional extra: say how to get it, never a traceback."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "--backend ray needs Ray on this machine: pip install 'reconcile-engines[ray]'"
        )


def open_backend(config: Config, store: RecordStore | None = None) -> Backend:
    """``store``: the state dir's record store, when the caller has one (one per state dir:
    the local backend keeps the engines' log files in it)."""
    if config.backend == RAY:
        _need_ray()
        # The driver runs in a child process (ray/driver.py): a head that dies takes it
        # along, never this process.
        from controller.backends.ray.proxy import RayProxy

        assert config.ray_address is not None  # resolve() insists
        state = str(config.state_dir.resolve())
        return RayProxy(config.ray_address, state, config.owner)
    from controller.backends.local.runtime import LocalBackend

    return LocalBackend(
        config.state_dir,
        config.node,
        store=store,
        container_runtime=config.container_runtime,
        static_devices=config.devices is not None,
        owner=config.owner,
        log_max_bytes=config.log_max_bytes,
    )


def inventory_for(config: Config) -> Inventory:
    """The devices engines may use: this node's, or (ray) every live node's GPUs."""
    if config.backend == RAY:
        _need_ray()
        from controller.backends.ray import proxy

        assert config.ray_address is not None
        return proxy.inventory(config.ray_address)
    from controller.host import devices

    return devices.resolve(config.devices)
