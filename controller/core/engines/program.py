"""The next move for an engine whose program could not be exec'd, at the field that names
it, with where its start looked (``engine_path``). Pure: the launcher says it once a start
failed, and `reconcile plan` before any start (``backends/local/execgate.findable``)."""

from __future__ import annotations

from controller.core.manifest.specs import Entry


def no_program(entry: Entry, looked: str | None) -> str:
    """The hint after "cannot exec 'x': <why>": install it or fix the field that names it
    (``engine: command``'s is its argv's first word, a typo there the likeliest cause), and
    ``looked``, the PATH the engine's start searched for a bare name (None: unknown, as on
    a cluster's node, or a path). ``spec.image`` alone reads as "run this image" to whoever
    comes from compose or Kubernetes; it is export's, and the engine ran as a process."""
    spec = entry.deployment.spec
    if spec.executable is not None:
        loc: tuple[str | int, ...] = ("spec", "executable")
        hint = ": install it or correct spec.executable"
    elif spec.engine == "command":
        loc = ("spec", "command", 0)
        hint = ": install it or correct spec.command[0] (a program on PATH, or its path)"
    else:
        loc = ("spec", "engine")
        hint = ": install the engine or set spec.executable"
    hint += f" ({entry.source}:{entry.line_at(loc)})"
    if spec.image is not None and spec.container is None:
        hint += (
            f", or run it in that image: `container: {{image: {spec.image}}}` "
            "(spec.image alone is for `reconcile export`)"
        )
    return hint if looked is None else f"{hint}; {looked}"
