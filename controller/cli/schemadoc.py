"""The manifest's JSON Schema with a description on every field, for editors' hover help.

``reconcile schema`` prints it; ``schema/deployment.schema.json`` is the same text
(a test keeps them equal), referenced from each manifest's first line::

    # yaml-language-server: $schema=../schema/deployment.schema.json
"""

from __future__ import annotations

from typing import Any

from controller.core.specs import json_schema

DOCS: dict[str, dict[str, str]] = {
    "Deployment": {
        "apiVersion": "Always reconcile/v1.",
        "kind": "Always Deployment.",
        "metadata": "The deployment's name and labels.",
        "spec": "The desired state of one engine instance.",
    },
    "Metadata": {
        "name": "DNS-1123 label: lower-case letters, digits and '-', at most 63 characters.",
        "labels": "Free-form string labels; changing them never restarts the engine.",
    },
    "DeploymentSpec": {
        "engine": "The recipe: vllm, llama-cpp, sglang, tgi, ollama, or command (any argv).",
        "model": "For engine recipes: a hub id or a local path.",
        "executable": "The recipe's program; else it is found on PATH.",
        "command": "engine: command only: the argv, never run through a shell. "
        "Placeholders: {port} {host} {name} {model} {devices}.",
        "args": "Appended to the recipe's argv (placeholders allowed).",
        "env": "Extra environment variables for the engine.",
        "devices": "The devices (GPUs) to lease for this engine.",
        "host": "The address the engine binds (default 127.0.0.1).",
        "port": "An exact port: the deployment waits, saying why, if anything holds it.",
        "basePort": "The first port to try, scanning upward (default 8000).",
        "readiness": "How and how long to wait for the engine to be ready.",
        "restartPolicy": "Always, OnFailure or Never (default Always).",
        "stopGracePeriodSeconds": "SIGTERM, then this long, then SIGKILL (default 30). "
        "Changing it needs no restart.",
        "strategy": "Recreate or RollingUpdate (default Recreate): how `reconcile export` "
        "rolls out a change (the local backend ignores it today); never restarts the engine.",
        "image": "`reconcile export` only: the container image (default: the recipe's pinned "
        "image; required for engine: command). Never restarts the engine.",
        "activation": "Always (default), or OnDemand: Idle (nothing held) until the gateway "
        "gets a request for it, stopped again after idleTimeout without one.",
        "idleTimeout": "OnDemand only: stopped (Idle) after this long without a request "
        "(30s, 10m, 1h; default 10m).",
        "aliases": "More model names the gateway routes here, besides metadata.name and "
        "spec.model; a name claimed twice is an error.",
        "priority": "When devices run short, a deployment stops (preempts) those of strictly "
        "lower priority (default 0, from -1000000000 to 1000000000). Changing it needs no restart.",
    },
    "Devices": {
        "count": "Devices needed; 0 = none (the engine then sees CUDA_VISIBLE_DEVICES='').",
        "kind": "nvidia, amd, apple, cpu, or any (default any).",
        "candidates": "Only these device ids (e.g. ['0', '1']).",
        "shareable": "Unified-memory devices stack instead of leasing exclusively.",
        "memory": "Memory needed on EACH device, e.g. 20Gi (Ki, Mi, Gi, Ti; k, M, G, T): "
        "devices are then shared and packed by memory. Unset: whole devices.",
    },
    "Readiness": {
        "httpGet": "Ready when GET path answers 2xx.",
        "tcpSocket": "Ready when the port accepts a connection.",
        "deadlineSeconds": "Not ready by then: killed and retried with back-off (default 600).",
        "periodSeconds": "Seconds between probes (default 2).",
    },
    "HttpGet": {"path": "The path to GET, starting with '/' (default /health)."},
}


def documented_schema() -> dict[str, Any]:
    schema = json_schema()
    for model, fields in DOCS.items():
        node = schema if model == "Deployment" else schema.get("$defs", {}).get(model, {})
        for name, text in fields.items():
            prop = node.get("properties", {}).get(name)
            if isinstance(prop, dict):
                prop.setdefault("description", text)
    return schema
