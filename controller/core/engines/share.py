"""A memory request as the engine's own pre-allocation flag. Pure.

vLLM and SGLang size their KV cache as a fraction of the whole device
(``--gpu-memory-utilization``, ``--mem-fraction-static``), so two of them on one
card each need their share spelled as that fraction, or the first grabs ~90% and
the second dies out of memory. The fraction is rounded DOWN: rounding up could
promise more than the ledger handed out. Other engines take no such flag (see
docs/engines.md): their memory request is a placement promise only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from controller.core.devices.inventory import Device
from controller.core.engines.spelling import spelling_of

if TYPE_CHECKING:  # a recipe (vllm, sglang) is imported by verbs that never load pydantic
    from controller.core.manifest.specs import DeploymentSpec

FLAGS: dict[str, str] = {
    "vllm": "--gpu-memory-utilization",
    "sglang": "--mem-fraction-static",
}


def fraction(memory: int, devices: Sequence[Device]) -> str | None:
    """``memory`` / the smallest device's memory, down to 2 decimals; None if unknown."""
    sizes = [d.memory for d in devices]
    if not sizes or None in sizes:
        return None
    smallest = min(s for s in sizes if s is not None)
    hundredths = max(1, min(100, memory * 100 // smallest))  # 0.00 would start nothing
    return f"{hundredths // 100}.{hundredths % 100:02d}"


def has_flag(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def share_args(
    engine: str, memory: int | None, devices: Sequence[Device], args: Sequence[str]
) -> tuple[str, ...]:
    """The flag and value to add to the engine's argv; none when the user set it."""
    flag = FLAGS.get(engine)
    value = fraction(memory, devices) if memory is not None else None
    if flag is None or value is None or spelling_of(engine, args, flag) is not None:
        return ()
    return (flag, value)


def user_share(spec: DeploymentSpec, devices: Sequence[Device]) -> str:
    """A note for `plan` when spec.args already sets the share flag, in any spelling the
    engine reads as it (spelling.py): the user's wins."""
    flag = FLAGS.get(spec.engine)
    memory = spec.devices.memory
    written = spelling_of(spec.engine, spec.args, flag) if flag is not None else None
    if flag is None or memory is None or written is None:
        return ""
    value = fraction(memory, devices)
    ours = f" over the computed {value}" if value else ""
    read = "" if written == flag else f" (read as {flag})"
    return f"; spec.args sets {written}{read}: the user's value wins{ours}"
