"""The Deployment model: validation, defaults, hashing, placeholders, schema."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from strategies import deployment, spec_body

from controller.core.manifest.engineenv import RECONCILE_SETS
from controller.core.manifest.specerrors import problems
from controller.core.manifest.specs import (
    Autoscale,
    Deployment,
    changed_fields,
    expand,
    json_schema,
    spec_document,
    spec_hash,
)


def doc(name: str = "web", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": spec_body(**spec),
    }


def error_of(data: dict[str, Any]) -> str:
    """Every problem as the loader reports it: ``path: message``, one per line."""
    with pytest.raises(ValidationError) as info:
        Deployment.model_validate(data)
    return "\n".join(f"{p.path}: {p.message}" for p in problems(info.value, data))


def test_defaults() -> None:
    spec = deployment("web").spec
    assert spec.devices.count == 0 and spec.devices.kind == "any"
    assert not spec.devices.shareable
    assert spec.port is None and spec.base_port is None
    assert spec.restart_policy == "Always"
    assert spec.stop_grace_period_seconds == 30
    assert spec.host == "127.0.0.1"


@pytest.mark.parametrize(
    "name", ["a", "web", "llama-8b", "a1", "0", "x" * 63], ids=lambda n: n[:12]
)
def test_dns1123_names_accepted(name: str) -> None:
    assert Deployment.model_validate(doc(name)).name == name


@pytest.mark.parametrize(
    "name",
    ["", "Web", "-a", "a-", "a_b", "a.b", "../etc", "a/b", "x" * 64, "a b", "é"],
    ids=[
        "empty",
        "upper",
        "lead-dash",
        "trail-dash",
        "underscore",
        "dot",
        "dotdot",
        "slash",
        "64-chars",
        "space",
        "unicode",
    ],
)
def test_unsafe_names_rejected(name: str) -> None:
    assert "name" in error_of(doc(name))


@pytest.mark.parametrize(
    ("spec", "phrase"),
    [
        ({"port": 8000, "basePort": 8000}, "not both"),
        ({"command": None}, "engine 'command' needs spec.command"),
        ({"engine": "vllm", "model": "m"}, "spec.command is only for engine 'command'"),
        ({"env": {"BAD-NAME": "x"}}, "not a valid environment variable name"),
        ({"port": 0}, "greater than or equal to 1"),
        ({"port": 70000}, "less than or equal to 65535"),
        ({"devices": {"count": -1}}, "greater than or equal to 0"),
        ({"devices": {"kind": "tpu"}}, "devices.kind"),
        ({"restartPolicy": "Sometimes"}, "restartPolicy"),
        ({"engine": "docker"}, "engine"),
        ({"readiness": {"httpGet": {}, "tcpSocket": {}}}, "httpGet or tcpSocket, not both"),
        ({"readiness": {"httpGet": {"path": "health"}}}, "must start with '/'"),
        ({"readiness": {"deadlineSeconds": 0}}, "greater than 0"),
        ({"stopGracePeriodSeconds": -1}, "greater than or equal to 0"),
        ({"args": [True]}, "valid string"),
        ({"replicas": -1}, "greater than or equal to 0"),
        ({"replicas": 2, "port": 8000}, "exact spec.port holds one engine"),
        ({"replicas": 2, "activation": "OnDemand"}, "use autoscale with min: 0"),
        ({"autoscale": {"max": 3}, "activation": "OnDemand"}, "without OnDemand"),
        ({"autoscale": {"min": 3, "max": 2}}, "autoscale.min (3) is above autoscale.max (2)"),
        ({"autoscale": {"max": 3}, "replicas": 5}, "outside autoscale's min..max (1..3)"),
        ({"autoscale": {"min": 1}}, "max"),
        ({"autoscale": {"max": 3, "metric": "queue"}}, "'inflight', 'waiting' or 'kvCache'"),
        (
            {"autoscale": {"max": 3, "metric": "kvCache", "target": 80}},
            "autoscale.target: 80 is above 1: with metric kvCache",
        ),
        ({"autoscale": {"max": 3, "target": 0}}, "greater than 0"),
        (
            {"autoscale": {"max": 3, "metric": "waiting", "targetInflight": 2}},
            "targetInflight is inflight's aim, not waiting's: use autoscale.target",
        ),
        ({"rollingUpdate": {"maxSurge": 1}}, "needs strategy: RollingUpdate"),
        (
            {"strategy": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}},
            "cannot both be 0",
        ),
        ({"strategy": "RollingUpdate", "rollingUpdate": {"maxSurge": "150%"}}, "percentage"),
        ({"strategy": "RollingUpdate", "rollingUpdate": {"maxSurge": "abc"}}, "percentage"),
        ({"strategy": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25"}}, "percentage"),
        ({"strategy": "RollingUpdate", "rollingUpdate": {"maxSurge": -1}}, "-1 is below 0"),
        ({"affinity": "sticky"}, "'none', 'session' or 'prefix'"),
        ({"devices": {"count": 1, "gpus": 2}}, "gpus"),
        ({"readiness": {"httpGet": {"path": "/", "port": 1}}}, "port"),
    ],
    ids=lambda v: str(v)[:40] if isinstance(v, str) else None,
)
def test_invalid_specs(spec: dict[str, Any], phrase: str) -> None:
    assert phrase in error_of(doc(**spec))


def test_unknown_fields_are_errors_at_every_level() -> None:
    data = doc()
    data["status"] = {}
    assert "Extra inputs are not permitted" in error_of(data)
    data = doc()
    data["metadata"]["namespace"] = "x"
    assert "metadata.namespace" in error_of(data)


def test_wrong_api_version_and_kind() -> None:
    assert "apiVersion" in error_of({**doc(), "apiVersion": "v1"})
    assert "kind" in error_of({**doc(), "kind": "Pod"})


def test_numbers_in_argv_and_env_become_strings() -> None:
    spec = deployment("web", args=["--max-model-len", 8192, 0.5], env={"N": 1}).spec
    assert spec.args == ("--max-model-len", "8192", "0.5")
    assert spec.env == {"N": "1"}


def test_models_are_frozen() -> None:
    spec = deployment("web").spec
    with pytest.raises(ValidationError, match="frozen"):
        spec.port = 1  # type: ignore[misc]


def test_hash_is_stable_and_ignores_labels() -> None:
    a = Deployment.model_validate(doc())
    labelled = doc()
    labelled["metadata"]["labels"] = {"team": "x"}
    b = Deployment.model_validate(labelled)
    assert spec_hash(a.spec) == spec_hash(b.spec)
    assert spec_hash(a.spec).startswith("sha256:")


def test_hash_changes_with_any_spec_field() -> None:
    base = spec_hash(deployment("web").spec)
    assert spec_hash(deployment("web", args=["--x"]).spec) != base
    assert spec_hash(deployment("web", devices={"count": 1}).spec) != base
    assert spec_hash(deployment("web", env={"A": "1"}).spec) != base


def test_export_only_fields_never_change_the_hash_or_the_diff() -> None:
    """`image` and `strategy` change nothing that runs here: no engine restarts for them,
    and records written before they existed compare equal."""
    base = deployment("web")
    other = deployment("web", image="ghcr.io/acme/engine:1.2", strategy="RollingUpdate")
    assert other.spec.image == "ghcr.io/acme/engine:1.2"
    assert other.spec.strategy == "RollingUpdate" and base.spec.strategy == "Recreate"
    assert spec_hash(other.spec) == spec_hash(base.spec)
    old_record = {
        k: v for k, v in spec_document(base.spec).items() if k not in ("image", "strategy")
    }
    assert changed_fields(old_record, spec_document(other.spec)) == []


def test_strategy_and_image_are_checked() -> None:
    assert "strategy" in error_of(doc(strategy="BlueGreen"))
    assert "image" in error_of(doc(image=""))


def test_defaults_written_or_not_hash_the_same() -> None:
    implicit = deployment("web")
    explicit = deployment("web", restartPolicy="Always", devices={"count": 0, "kind": "any"})
    assert spec_hash(implicit.spec) == spec_hash(explicit.spec)


def test_changed_fields_names_nested_paths() -> None:
    old = spec_document(deployment("web").spec)
    new = spec_document(deployment("web", devices={"count": 2}, args=["-v"]).spec)
    assert changed_fields(old, new) == ["args", "devices.count"]
    assert changed_fields(old, old) == []


def test_document_uses_manifest_spelling() -> None:
    document = spec_document(deployment("web", basePort=9000).spec)
    assert document["basePort"] == 9000
    assert "stopGracePeriodSeconds" in document and "base_port" not in document


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{port}", "8000"),
        ("--bind={host}:{port}", "--bind=127.0.0.1:8000"),
        ("{name}/{model}/{devices}", "web/m/0,1"),
        ('{"json": {port}}', '{"json": 8000}'),
        ("{unknown}", "{unknown}"),
        ("{{port}}", "{8000}"),
    ],
    ids=lambda v: v,
)
def test_expand_placeholders(template: str, expected: str) -> None:
    values = {"port": "8000", "host": "127.0.0.1", "name": "web", "model": "m", "devices": "0,1"}
    assert expand(template, values) == expected


@pytest.mark.parametrize(
    ("field", "item", "phrase"),
    [
        (
            "command",
            "--port={prot}",
            "spec.command.1: unknown placeholder '{prot}': did you mean {port}?",
        ),
        ("args", "{PORT}", "spec.args.0: unknown placeholder '{PORT}': did you mean {port}?"),
        ("args", "{mdoel}", "did you mean {model}?"),
        ("args", "{device}", "did you mean {devices}?"),
        ("args", "{gpu}", "unknown placeholder '{gpu}' (placeholders: {port} {host}"),
    ],
)
def test_an_unknown_placeholder_is_a_validation_error(field: str, item: str, phrase: str) -> None:
    """`{prot}` passed validate and the engine died of it (issue 34, item 17)."""
    spec: dict[str, Any] = {"command": ["serve", item]} if field == "command" else {"args": [item]}
    assert phrase in error_of(doc(**spec))


def test_model_placeholder_with_no_model_is_a_validation_error() -> None:
    """`{model}` expanded to "" when the spec named no model: `vllm serve ""`, found only
    when the engine died of it."""
    assert "spec.args uses {model}, but the spec names no model" in error_of(
        doc(args=["--model", "{model}"])
    )
    said = error_of(doc(command=["serve", "{model}"]))
    assert "spec.command uses {model}" in said and "set spec.model" in said, said
    named = Deployment.model_validate(doc(args=["{model}"], model="org/m"))
    assert named.spec.args == ("{model}",)


@pytest.mark.parametrize(
    "item", ['{"json": {port}}', "${HOME}", "{{ messages }}", "{{port}}", "{python}", "{}", "{1}"]
)
def test_braces_that_are_no_placeholder_pass(item: str) -> None:
    assert Deployment.model_validate(doc(args=[item])).spec.args == (item,)


def test_json_schema_forbids_unknown_fields() -> None:
    schema = json_schema()
    assert schema["title"] == "reconcile Deployment"
    assert schema["$schema"].endswith("2020-12/schema")
    spec = schema["$defs"]["DeploymentSpec"]
    assert spec["additionalProperties"] is False
    assert "basePort" in spec["properties"]


# Hashes written by the pydantic models of 0.1 (2026-12-01), and by every release since:
# any change to the models must hash every spec the same, or an upgrade would restart
# every engine.
PINNED = [
    (
        {"engine": "command", "command": ["serve", "{port}"]},
        "sha256:414aa77d210d427a70464617f1bd09a8d21b59743c9509f3d4dbbd4a421513f0",
    ),
    (
        {
            "engine": "vllm",
            "model": "meta/llama",
            "args": ["--max-model-len", 8192, 0.5],
            "env": {"A": 1, "B": "x"},
            "devices": {
                "count": 2,
                "kind": "nvidia",
                "candidates": [0, "1"],
                "shareable": True,
                "memory": "20Gi",
            },
            "host": "0.0.0.0",
            "basePort": 9000,
            "readiness": {
                "httpGet": {"path": "/v1/models"},
                "deadlineSeconds": 600,
                "periodSeconds": 1,
            },
            "restartPolicy": "OnFailure",
            "stopGracePeriodSeconds": 5,
            "activation": "OnDemand",
            "idleTimeout": "10m",
            "strategy": "RollingUpdate",
            "aliases": ["a"],
            "image": "img",
            "priority": 5,
        },
        "sha256:e96a18f5fe85f4c835809fc4ae7f0a4ab08021d53ad09946495bbd7042da494c",
    ),
    (
        {
            "engine": "llama-cpp",
            "model": "/m.gguf",
            "executable": "/bin/llama-server",
            "port": 8080,
            "readiness": {"tcpSocket": {}},
        },
        "sha256:c8150a9dd63f772c5dd3c2ed258ab829f0b3a4bc611c49f817141a292fd4060d",
    ),
]


@pytest.mark.parametrize(("spec", "pinned"), PINNED, ids=["command", "every-field", "tcp"])
def test_hashes_match_the_pydantic_releases(spec: dict[str, Any], pinned: str) -> None:
    data = {**doc(), "spec": spec}
    data["metadata"]["labels"] = {"a": "b"}
    assert spec_hash(Deployment.model_validate(data).spec) == pinned


def test_every_problem_of_a_document_is_reported_with_its_path() -> None:
    data = {**doc("Web", port=0, devices={"count": -1, "kind": "tpu"}, surprise=1)}
    data["apiVersion"] = "v1"
    with pytest.raises(ValidationError) as info:
        Deployment.model_validate(data)
    where = {p.path: p.message for p in problems(info.value, data)}
    assert where == {
        "apiVersion": "Input should be 'reconcile/v1', not 'v1'",
        "metadata.name": where["metadata.name"],
        "spec.surprise": "Extra inputs are not permitted",
        "spec.devices.count": "Input should be greater than or equal to 0",
        "spec.devices.kind": "Input should be 'nvidia', 'amd', 'apple', 'cpu' or 'any', not 'tpu'",
        "spec.port": "Input should be greater than or equal to 1",
    }
    assert "is not a DNS-1123 label" in where["metadata.name"]


@pytest.mark.parametrize(
    ("spec", "field", "value"),
    [
        ({"port": "8080"}, "port", 8080),  # numbers as strings, as pydantic's lax mode took
        ({"stopGracePeriodSeconds": "2.5"}, "stop_grace_period_seconds", 2.5),
        ({"devices": {"count": 1.0}}, "devices", 1),
        ({"idleTimeout": "90s"}, "idle_timeout", 90.0),
        ({"devices": {"count": 1, "shareable": 1}}, "devices", 1),
        ({"devices": {"count": 1, "shareable": "yes"}}, "devices", 1),
    ],
)
def test_lax_numbers(spec: dict[str, Any], field: str, value: object) -> None:
    got = getattr(deployment("web", **spec).spec, field)
    assert (got.count if field == "devices" else got) == value
    if "shareable" in spec.get("devices", {}):
        assert got.shareable is True


def test_priority_takes_no_string() -> None:
    assert "valid integer" in error_of(doc(priority="5"))


def test_the_builtin_sha256_is_hashlib_s() -> None:
    import hashlib

    from controller.core.digest import sha256_hex

    for data in (b"", b"abc", bytes(range(256)) * 100):
        assert sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_a_boolean_is_not_any_number() -> None:
    assert "valid boolean" in error_of(doc(devices={"count": 1, "shareable": 2}))


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"devices": {"count": True}}, "spec.devices.count"),
        ({"port": True}, "spec.port"),
        ({"readiness": {"periodSeconds": False}}, "spec.readiness.periodSeconds"),
        ({"idleTimeout": True}, "spec.idleTimeout"),
    ],
)
def test_a_yaml_boolean_is_no_number(spec: dict[str, Any], field: str) -> None:
    """pydantic's lax mode reads True as 1; YAML reads `on`/`yes` as True: refused."""
    assert f"{field}: Input should be a number, not " in error_of(doc(**spec))


def test_a_wrong_shape_is_said_in_the_manifest_s_words() -> None:
    message = error_of(doc(devices="two"))
    assert message == "spec.devices: Input should be a mapping of fields, not str"


def test_replica_fields_and_their_defaults() -> None:
    spec = deployment("a").spec
    # affinity None: the engine's default (prefix for engines that cache prefixes)
    assert (spec.replicas, spec.autoscale, spec.affinity, spec.rolling_update) == (
        1,
        None,
        None,
        None,
    )
    scaled = deployment(
        "a",
        autoscale={"min": 0, "max": 4, "targetInflight": "2", "scaleDownDelay": "1m"},
        affinity="session",
        strategy="RollingUpdate",
        rollingUpdate={"maxSurge": "25%", "maxUnavailable": 1},
    ).spec
    assert scaled.autoscale is not None and scaled.autoscale.scale_down_delay == 60
    assert scaled.autoscale.target_inflight == 2 and scaled.initial_replicas == 0
    assert scaled.rolling_update is not None and scaled.rolling_update.max_surge == "25%"
    assert deployment("a", replicas=3, autoscale={"max": 4}).spec.initial_replicas == 3


def test_autoscale_metric_and_its_target_per_replica() -> None:
    plain = Autoscale(max=3)
    assert (plain.metric, plain.target_of("inflight"), plain.target_of("waiting")) == (
        "inflight",
        4.0,
        2.0,
    )
    kv = Autoscale(max=3, metric="kvCache")
    assert (kv.target_of("kvCache"), kv.target_of("inflight")) == (0.8, 4.0)
    waiting = Autoscale(max=3, metric="waiting", target=5)
    assert waiting.target_of("waiting") == 5 and waiting.target_of("inflight") == 4.0


def test_replica_fields_never_change_the_spec_hash() -> None:
    """Scaling, affinity and the update's pace never restart an engine."""
    base = spec_hash(deployment("a").spec)
    for extra in (
        {"replicas": 3},
        {"autoscale": {"max": 4}},
        {"affinity": "session"},
        {"strategy": "RollingUpdate", "rollingUpdate": {"maxSurge": 2}},
    ):
        assert spec_hash(deployment("a", **extra).spec) == base, extra


def test_a_duration_string_in_a_seconds_field_says_the_unit() -> None:
    """`stopGracePeriodSeconds: 30s` got "Input should be a valid number" (idleTimeout
    takes "90s"): the field's name says its unit."""
    said = error_of(doc(stopGracePeriodSeconds="30s"))
    assert "spec.stopGracePeriodSeconds: a number of seconds (e.g. 30), not '30s'" in said


def test_a_placeholder_in_env_is_a_validation_error() -> None:
    """`env: {URL: "http://localhost:{port}"}` reached the engine as that literal text."""
    said = error_of(doc(env={"URL": "http://localhost:{port}/v1"}))
    assert "env URL: {port} is not expanded in env" in said, said
    assert Deployment.model_validate(doc(env={"JSON": '{"a": 1}'})).spec.env == {"JSON": '{"a": 1}'}


@pytest.mark.parametrize("name", sorted(RECONCILE_SETS))
def test_spec_env_may_not_set_what_reconcile_sets(name: str) -> None:
    """`env: {PORT: "9000"}` was replaced by the reserved port without a word: the key is
    refused at its own path, saying where reconcile's value comes from."""
    said = error_of(doc(env={"HF_HOME": "/data/hf", name: "9000"}))
    assert said.startswith(f"spec.env.{name}: reconcile sets {name} "), said
    assert "HF_HOME" not in said, said  # the user's own variables are theirs


def test_cuda_device_order_given_reconcile_s_own_value_is_accepted_and_restarts_nothing() -> None:
    """`env: {CUDA_DEVICE_ORDER: PCI_BUS_ID}`, as vLLM's and NVIDIA's guides write it, was
    refused from 2026-12-06 (an upgraded node called a running deployment's spec invalid):
    it is the value reconcile sets anyway, so it is taken, and the line changes no hash.
    Another value would renumber the GPUs under the fence: refused on the key's line."""
    plain = Deployment.model_validate(doc(env={"HF_HOME": "/data/hf"}))
    said = Deployment.model_validate(
        doc(env={"HF_HOME": "/data/hf", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    )
    assert spec_hash(said.spec) == spec_hash(plain.spec)
    refused = error_of(doc(env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}))
    assert refused.startswith("spec.env.CUDA_DEVICE_ORDER: reconcile sets CUDA_DEVICE_ORDER")
    assert "(or give it PCI_BUS_ID)" in refused, refused


def test_the_refused_variables_say_what_to_write_instead() -> None:
    assert "spec.port" in error_of(doc(env={"PORT": "1"}))
    assert "spec.devices" in error_of(doc(env={"CUDA_VISIBLE_DEVICES": "1"}))
    assert "spec.devices" in error_of(doc(env={"HIP_VISIBLE_DEVICES": "1"}))


@pytest.mark.parametrize(
    "spec",
    [
        {},  # every field at its default: fallbackAfter 30s with no fallbacks
        {"fallbacks": ["other"], "fallbackAfter": "5s"},
        {"container": {"image": "engine:1"}, "env": {"A": "b"}},
    ],
    ids=["defaults", "fallbacks", "container"],
)
def test_a_records_stored_spec_validates_again(spec: dict[str, Any]) -> None:
    """A record keeps its spec as ``spec_document`` writes it, every field at its default
    included, and a pass validates it again (the image pulls a record still names,
    reconciler/pulling.py): a check of what a manifest writes (fallbackAfter without
    fallbacks) made on the model refused every stored spec, and the pulls went."""
    stored = spec_document(deployment("web", **spec).spec)
    again = type(deployment("web").spec).model_validate(stored)
    assert spec_document(again) == stored
