"""The variables reconcile sets in every engine's environment, refused in ``spec.env``. Pure.

DESIGN.md "The engine's environment": every engine gets ``PORT``, ``RECONCILE_NAME``,
``RECONCILE_INSTANCE`` and its devices' visibility variable, set from the placement after
``spec.env`` (``render.py``, ``inventory.visibility_env``, the backends' marker). A value the
manifest gave them was silently replaced: ``env: {PORT: "9000"}`` said nothing and the
engine got the reserved port. Kubernetes' device plugins do the same to
``NVIDIA_VISIBLE_DEVICES``, and people lose hours to it; here the manifest is refused when
it is read (validate, plan, a pass), naming the key and what to write instead. An
``envFrom`` file's keys are known only when a pass (or `plan`) reads it: one naming such a
variable is refused there, in the same words (``host/secrets.py``).
"""

from __future__ import annotations

_PORT = (
    "to the port it reserved for the instance: choose it with spec.port (exact) or "
    "spec.basePort, and read $PORT or write {port} in command or args"
)
_IDENTITY = "itself: it is the instance's identity, how a later pass finds the engine"
_FENCE = (
    "from the devices it placed the engine on: choose them with spec.devices "
    '(count, kind, candidates: ["0"]); count: 0 hides every GPU'
)

# Each variable reconcile sets, and where its value comes from (the next move included).
RECONCILE_SETS: dict[str, str] = {
    "PORT": _PORT,
    "RECONCILE_NAME": "to metadata.name",
    "RECONCILE_INSTANCE": _IDENTITY,
    "RECONCILE_STATE": _IDENTITY,
    "RECONCILE_STATE_ID": _IDENTITY,
    "RECONCILE_OWNER": _IDENTITY,
    "CUDA_VISIBLE_DEVICES": _FENCE,
    # With ids (a static inventory), the order decides which GPU "0" is: part of the fence.
    "CUDA_DEVICE_ORDER": "to PCI_BUS_ID, so device numbers are nvidia-smi's (the ones it "
    "placed by)",
    "HIP_VISIBLE_DEVICES": _FENCE,
    "ROCR_VISIBLE_DEVICES": _FENCE,
}


def refusal(name: str, where: str) -> str | None:
    """Why ``where`` (``spec.env``, an envFrom file) may not set ``name``, in the words
    every such error shares; None: the variable is the user's."""
    source = RECONCILE_SETS.get(name)
    if source is None:
        return None
    return f"reconcile sets {name} {source}; remove it from {where}"


def not_reconciles(name: str) -> str:
    """A spec.env key, unless reconcile sets that variable itself (ValueError)."""
    why = refusal(name, "spec.env")
    if why is not None:
        raise ValueError(why)
    return name
