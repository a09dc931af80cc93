"""Verb -> handler, as a typed table: mypy checks every handler's signature.

Each verb group's module is imported only when one of its verbs runs, so `--once`
and `status` do not pay for `export`'s converter or the node verbs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping

Handler = Callable[[argparse.Namespace], int]
Group = Callable[[], Mapping[str, Handler]]


def _commands() -> Mapping[str, Handler]:
    from controller.cli import commands

    return {"run": commands.cmd_run, "validate": commands.cmd_validate, "down": commands.cmd_down}


def _operator() -> Mapping[str, Handler]:
    from controller.cli import opverbs

    return {
        "plan": opverbs.cmd_plan,
        "status": opverbs.cmd_status,
        "get": opverbs.cmd_status,
        "describe": opverbs.cmd_describe,
        "logs": opverbs.cmd_logs,
        "schema": opverbs.cmd_schema,
    }


def _node() -> Mapping[str, Handler]:
    from controller.cli import nodeverbs

    return {
        "devices": nodeverbs.cmd_devices,
        "drain": nodeverbs.cmd_drain,
        "uncordon": nodeverbs.cmd_uncordon,
    }


def _export() -> Mapping[str, Handler]:
    from controller.cli import exportverb

    return {"export": exportverb.cmd_export}


def _gateway() -> Mapping[str, Handler]:
    from controller.cli import gatewayverbs

    return {"gateway": gatewayverbs.cmd_gateway}


def _completion() -> Mapping[str, Handler]:
    from controller.cli import completion

    return {"completion": completion.cmd_completion}


GROUPS: tuple[Group, ...] = (_commands, _operator, _node, _export, _gateway, _completion)
# verb -> its group; "run" is no verb: the control loop, or --once
VERBS: Mapping[str, Group] = {
    "run": _commands,
    "validate": _commands,
    "down": _commands,
    "plan": _operator,
    "status": _operator,
    "get": _operator,
    "describe": _operator,
    "logs": _operator,
    "schema": _operator,
    "devices": _node,
    "drain": _node,
    "uncordon": _node,
    "export": _export,
    "gateway": _gateway,
    "completion": _completion,
}


def handler(verb: str) -> Handler:
    return VERBS[verb]()[verb]


def dispatch(args: argparse.Namespace) -> int:
    return handler(args.verb or "run")(args)
