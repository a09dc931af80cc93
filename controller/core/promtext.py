"""Prometheus' text exposition format: families and samples, labels escaped. Pure.

Written by the daemon's metrics (``/metrics``, the textfile) and the gateway's.
"""

from __future__ import annotations


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


class PromText:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, help_text: str, kind: str = "gauge") -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value: float, **labels: str) -> None:
        shown = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
        head = f"{name}{{{shown}}}" if shown else name
        self.lines.append(f"{head} {number(value)}")
