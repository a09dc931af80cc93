"""``engine: command``: the user's own argv, run as is (never through a shell)."""

from __future__ import annotations

from controller.core.engines.base import (
    CompletionTarget,
    Launch,
    ReadinessChecks,
    RecipeError,
    RenderContext,
)


class CommandRecipe:
    engine = "command"
    extra_ports = 0
    deadline_seconds = 600.0  # the user's program: no recipe knows better
    caches_prefixes = False  # the user's program: nothing known of its cache

    def launch(self, ctx: RenderContext) -> Launch:
        if not ctx.command:
            raise RecipeError("engine 'command' needs spec.command (an argv list)")
        argv = ctx.command + ctx.args
        if ctx.executable:
            argv = (ctx.executable, *argv[1:])
        # No built-in probe: without spec.readiness the engine is ready once it runs, and
        # without spec.livenessProbe nothing checks it once Ready. A `completion` probe
        # asks the OpenAI chat path for spec.model, else the deployment's name.
        return Launch(
            argv=argv,
            readiness=ReadinessChecks(),
            completion=CompletionTarget(model=ctx.model or ctx.name),
        )


RECIPE = CommandRecipe()
