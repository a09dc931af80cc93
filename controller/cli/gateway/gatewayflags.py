"""``--listen`` and its companions -> the daemon's :class:`Keeper` of the gateway process
(started, or adopted, once the daemon holds its lock), or exit 64."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from controller.cli.common import EXIT_USAGE
from controller.gateway import settings as gw
from controller.gateway.accounting.keys import KeyFileError
from controller.gateway.lifecycle import tls
from controller.gateway.lifecycle.keeper import Keeper, preflight, warn_out_of_date
from controller.logsetup import get_logger
from controller.store.config.node import Config
from controller.store.statedir import StateDir


def front_door(args: argparse.Namespace, cfg: Config, listen: str) -> Keeper | int:
    """The gateway the flags ask for; a refusal is printed and returns exit 64."""
    try:
        settings = _settings(args, cfg, listen)
        warning = gw.check_exposure(settings)
        preflight(settings)  # refused here (64), not by the gateway process
        # At SIGHUP the node file is read again: its tlsCert/tlsKey and log rotation.
        gateway = Keeper(settings, settle=lambda fresh: _settings(args, fresh, listen))
    except (gw.ListenRefused, KeyFileError, tls.TlsError) as exc:
        print(f"reconcile: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if warning:
        get_logger("reconcile").warning("insecure gateway", detail=warning)
    warn_out_of_date(settings)
    plain = tls.plain_warning(settings.host, settings.port, settings.loopback, settings.tls)
    if plain:
        get_logger("reconcile").warning("gateway without TLS", detail=plain)
    if cfg.metrics_file or cfg.metrics_port:
        from controller.daemon.metrics import add_source, gateway_series

        add_source(lambda: gateway_series(*gateway.metrics()))
    return gateway


def _settings(args: argparse.Namespace, cfg: Config, listen: str) -> gw.Settings:
    """The settings the flags, the environment and ``cfg`` (node.yaml) ask for; the
    files they name are not read here (``preflight``)."""
    keys = args.api_keys or os.environ.get("RECONCILE_API_KEYS")
    host, port = gw.parse_listen(listen)
    cert, key = _tls_pair(args, cfg)
    client_ca = _path(args.tls_client_ca or os.environ.get("RECONCILE_TLS_CLIENT_CA"))
    if client_ca is not None and cert is None:
        raise gw.ListenRefused(
            "--tls-client-ca without --tls-cert/--tls-key: client certificates are "
            "asked for in the TLS handshake; give the gateway its own pair too"
        )
    return gw.Settings(
        host=host,
        port=port,
        state_dir=cfg.state_dir.absolute(),  # the gateway process runs in /
        api_keys=Path(keys).expanduser().absolute() if keys else None,
        insecure=args.insecure_listen,
        max_body=_positive(args.max_body, "--max-body", gw.DEFAULT_MAX_BODY),
        max_body_total=_total(args),
        max_inflight=_positive(args.max_inflight, "--max-inflight", gw.DEFAULT_MAX_INFLIGHT),
        max_queue=_positive(args.max_queue, "--max-queue", gw.DEFAULT_MAX_QUEUE, zero=True),
        owner=cfg.owner,
        node=cfg.node,
        verbosity=-1 if args.quiet else args.verbose,
        devices=cfg.devices,
        tls_cert=cert,
        tls_key=key,
        tls_client_ca=client_ca,
        log_max_bytes=cfg.log_max_bytes,
        log_keep=cfg.log_keep,
        node_config=_path(args.node_config or os.environ.get("RECONCILE_NODE_CONFIG")),
        node_tls=not _tls_given(args),
        waiting_comment=gw.waiting_every_from_env(),
    )


def _tls_pair(args: argparse.Namespace, cfg: Config) -> tuple[Path | None, Path | None]:
    """--tls-cert/--tls-key, else RECONCILE_TLS_*, else node.yaml's: both or neither."""
    env = os.environ
    cert = _path(args.tls_cert or env.get("RECONCILE_TLS_CERT")) or cfg.tls_cert
    key = _path(args.tls_key or env.get("RECONCILE_TLS_KEY")) or cfg.tls_key
    if (cert is None) != (key is None):
        given, missing = ("--tls-cert", "--tls-key") if key is None else ("--tls-key", "--tls-cert")
        why = f"{given} without {missing}: HTTPS needs both the certificate and its private key"
        if not _tls_given(args):  # node.yaml's half pair: named there, not as flags
            from controller.store.config.nodeconfig import setting_at  # a refusal's only

            node_file = _path(args.node_config or env.get("RECONCILE_NODE_CONFIG"))
            where = node_file or StateDir(cfg.state_dir).node_config
            why = why.replace("--tls-cert", "tlsCert").replace("--tls-key", "tlsKey")
            at = setting_at(where, "tlsCert" if key is None else "tlsKey")
            why = f"{at}: {why}; give both or neither"
        raise gw.ListenRefused(why)
    return cert, key


def _tls_given(args: argparse.Namespace) -> bool:
    """Whether a flag or the environment names the TLS pair (else node.yaml decides)."""
    env = os.environ
    named = (
        args.tls_cert,
        args.tls_key,
        env.get("RECONCILE_TLS_CERT"),
        env.get("RECONCILE_TLS_KEY"),
    )
    return any(named)


def reread(settings: gw.Settings) -> gw.Settings:
    """The settings ``reconcile gateway restart`` starts a gateway with: the daemon's
    flags as the running gateway holds them (the CLI has not the daemon's), node.yaml's
    (the TLS pair unless a flag named it, the request log's rotation) as the daemon's
    start would read the file now. A ConfigError names the file, line and field."""
    from controller.store.config.nodeconfig import read_node_file, setting_at  # pydantic

    explicit = str(settings.node_config) if settings.node_config else None
    node = read_node_file(explicit, settings.state_dir)
    cert, key = settings.tls_cert, settings.tls_key
    if settings.node_tls:
        cert, key = node.tls_path("tls_cert"), node.tls_path("tls_key")
    if (cert is None) != (key is None):
        where = Path(explicit) if explicit else StateDir(settings.state_dir).node_config
        at = setting_at(where, "tlsCert" if key is None else "tlsKey")
        raise gw.ListenRefused(
            f"{at}: tlsCert and tlsKey go together: HTTPS needs both the certificate "
            "and its private key; give both or neither"
        )
    if settings.tls_client_ca is not None and cert is None:
        raise gw.ListenRefused(
            f"--tls-client-ca {settings.tls_client_ca} without a TLS pair: node.yaml no "
            "longer names tlsCert/tlsKey; name them again or restart the daemon without it"
        )
    return replace(
        settings,
        tls_cert=cert,
        tls_key=key,
        log_max_bytes=node.log_max_bytes,
        log_keep=node.log_max_files,
    )


def _path(text: str | None) -> Path | None:
    return Path(text).expanduser().absolute() if text else None


def _total(args: argparse.Namespace) -> int:
    """--max-body-total: unset, the default or --max-body if larger; set, at least that."""
    largest = _positive(args.max_body, "--max-body", gw.DEFAULT_MAX_BODY)
    total = _positive(args.max_body_total, "--max-body-total", gw.DEFAULT_MAX_BODY_TOTAL)
    if args.max_body_total is None:
        return max(total, largest)
    if total < largest:
        raise gw.ListenRefused(
            f"--max-body-total {total} is below --max-body {largest}: a body that large "
            "could never be held; raise --max-body-total or lower --max-body"
        )
    return total


def _positive(value: int | None, flag: str, default: int, zero: bool = False) -> int:
    if value is None:
        return default
    if value < 0 or (value == 0 and not zero):
        raise gw.ListenRefused(f"{flag} must be {'0 or more' if zero else 'at least 1'}")
    return value
