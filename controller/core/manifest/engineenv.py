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


# Those reconcile sets to one value whatever the placement: the manifest may say the same
# value (vLLM's and NVIDIA's guides write CUDA_DEVICE_ORDER=PCI_BUS_ID; refused from
# 2026-12-06, an upgraded node called such a deployment's spec invalid), never another.
FIXED: dict[str, str] = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def refusal(name: str, where: str, value: str | None = None) -> str | None:
    """Why ``where`` (``spec.env``, an envFrom file) may not set ``name`` (to ``value``,
    where known), in the words every such error shares; None: the variable is the user's,
    or the value is the one reconcile sets anyway (``FIXED``)."""
    source = RECONCILE_SETS.get(name)
    if source is None or (value is not None and FIXED.get(name) == value):
        return None
    same = f" (or give it {FIXED[name]})" if name in FIXED else ""
    return f"reconcile sets {name} {source}; remove it from {where}{same}"


def without_fixed(env: object) -> object:
    """``spec.env`` before its keys are checked: a ``FIXED`` variable given its own value
    left out (the engine gets that value from reconcile anyway, and a spec that says it
    hashes as one that does not: adding the line restarts nothing). Any other value stays,
    for its key's check to refuse on the key's own line."""
    if not isinstance(env, dict) or not any(env.get(k) == v for k, v in FIXED.items()):
        return env
    return {k: v for k, v in env.items() if FIXED.get(k) != v}


def not_reconciles(name: str) -> str:
    """A spec.env key, unless reconcile sets that variable itself (ValueError)."""
    why = refusal(name, "spec.env")
    if why is not None:
        raise ValueError(why)
    return name
