"""Verb -> handler, as a typed table: mypy checks every handler's signature."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping

from controller.cli import commands, completion, nodeverbs, opverbs

Handler = Callable[[argparse.Namespace], int]

HANDLERS: Mapping[str, Handler] = {
    "run": commands.cmd_run,  # no verb: the control loop, or --once
    "validate": commands.cmd_validate,
    "down": commands.cmd_down,
    "plan": opverbs.cmd_plan,
    "status": opverbs.cmd_status,
    "get": opverbs.cmd_status,
    "describe": opverbs.cmd_describe,
    "logs": opverbs.cmd_logs,
    "schema": opverbs.cmd_schema,
    "devices": nodeverbs.cmd_devices,
    "drain": nodeverbs.cmd_drain,
    "uncordon": nodeverbs.cmd_uncordon,
    "completion": completion.cmd_completion,
}


def dispatch(args: argparse.Namespace) -> int:
    return HANDLERS[args.verb or "run"](args)
