"""The kubelet's ``$(VAR)`` expansion of a container's strings, as Kubernetes does it
(``third_party/forked/golang/expansion/expand.go``), for tests that check what the
program in a pod receives: an exported container is right when, expanded, it is what
reconcile runs locally.

* ``$$`` is one ``$``;
* ``$(NAME)`` is NAME's value when the container defines NAME, else stays as written
  (an unclosed ``$(`` too);
* a ``$`` before any other character, or at the end, stays as it is.

Env values are expanded in order, each seeing the variables defined above it;
``command`` and ``args`` see them all (``kubelet_container_runtime``'s order).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def expand(text: str, defined: Mapping[str, str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
            continue
        after = text[i + 1]
        if after == "$":
            out.append("$")
            i += 2
        elif after == "(":
            close = text.find(")", i + 2)
            if close == -1:  # incomplete: "$(" as written, the rest read on
                out.append("$(")
                i += 2
                continue
            name = text[i + 2 : close]
            out.append(defined.get(name, f"$({name})"))
            i = close + 1
        else:
            out.append("$" + after)
            i += 2
    return "".join(out)


def container_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The container's literal ``env`` values as its program sees them."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = expand(item["value"], env)
    return env


def container_argv(container: Mapping[str, Any]) -> list[str]:
    """The container's ``command`` + ``args`` as its program receives them."""
    env = container_env(container)
    return [expand(a, env) for a in [*container["command"], *container.get("args", [])]]
