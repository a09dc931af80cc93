"""Verb -> handler: one typed table, each verb named once (main.py's parser defines its
arguments; a test checks the two agree).

Each handler imports its module only when its verb runs, so `--once` and `status` do
not pay for `export`'s converter or the node verbs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping

Handler = Callable[[argparse.Namespace], int]


def _run(args: argparse.Namespace) -> int:
    from controller.cli.operate.runverb import cmd_run

    return cmd_run(args)


def _events(args: argparse.Namespace) -> int:
    from controller.cli.look.eventsverb import cmd_events

    return cmd_events(args)


def _validate(args: argparse.Namespace) -> int:
    from controller.cli.operate.runverb import cmd_validate

    return cmd_validate(args)


def _down(args: argparse.Namespace) -> int:
    from controller.cli.operate.downverb import cmd_down

    return cmd_down(args)


def _restart(args: argparse.Namespace) -> int:
    from controller.cli.operate.restartverb import cmd_restart

    return cmd_restart(args)


def _plan(args: argparse.Namespace) -> int:
    from controller.cli.look.opverbs import cmd_plan

    return cmd_plan(args)


def _status(args: argparse.Namespace) -> int:
    from controller.cli.look.statusverb import cmd_status

    return cmd_status(args)


def _describe(args: argparse.Namespace) -> int:
    from controller.cli.look.opverbs import cmd_describe

    return cmd_describe(args)


def _logs(args: argparse.Namespace) -> int:
    from controller.cli.look.replicalogs import cmd_logs

    return cmd_logs(args)


def _schema(args: argparse.Namespace) -> int:
    from controller.cli.look.opverbs import cmd_schema

    return cmd_schema(args)


def _devices(args: argparse.Namespace) -> int:
    from controller.cli.operate.nodeverbs import cmd_devices

    return cmd_devices(args)


def _drain(args: argparse.Namespace) -> int:
    from controller.cli.operate.nodeverbs import cmd_drain

    return cmd_drain(args)


def _uncordon(args: argparse.Namespace) -> int:
    from controller.cli.operate.nodeverbs import cmd_uncordon

    return cmd_uncordon(args)


def _export(args: argparse.Namespace) -> int:
    from controller.cli.look.exportverb import cmd_export

    return cmd_export(args)


def _gateway(args: argparse.Namespace) -> int:
    from controller.cli.gateway.gatewayverbs import cmd_gateway

    return cmd_gateway(args)


def _ui(args: argparse.Namespace) -> int:
    from controller.cli.gateway.uiverb import cmd_ui

    return cmd_ui(args)


def _models(args: argparse.Namespace) -> int:
    from controller.cli.operate.modelsverb import cmd_models

    return cmd_models(args)


def _source(args: argparse.Namespace) -> int:
    from controller.cli.look.sourceverb import cmd_source

    return cmd_source(args)


def _history(args: argparse.Namespace) -> int:
    from controller.cli.operate.rollbackverb import cmd_history

    return cmd_history(args)


def _rollback(args: argparse.Namespace) -> int:
    from controller.cli.operate.rollbackverb import cmd_rollback

    return cmd_rollback(args)


def _completion(args: argparse.Namespace) -> int:
    from controller.cli.completion import cmd_completion

    return cmd_completion(args)


# "run" is no verb: the control loop, or --once; "get" is kubectl's name for status.
VERBS: Mapping[str, Handler] = {
    "run": _run,
    "events": _events,
    "validate": _validate,
    "down": _down,
    "restart": _restart,
    "plan": _plan,
    "status": _status,
    "get": _status,
    "describe": _describe,
    "logs": _logs,
    "schema": _schema,
    "devices": _devices,
    "drain": _drain,
    "uncordon": _uncordon,
    "export": _export,
    "gateway": _gateway,
    "ui": _ui,
    "models": _models,
    "source": _source,
    "history": _history,
    "rollback": _rollback,
    "completion": _completion,
}


def handler(verb: str) -> Handler:
    return VERBS[verb]


def dispatch(args: argparse.Namespace) -> int:
    return handler(args.verb or "run")(args)
