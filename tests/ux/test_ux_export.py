"""`reconcile export` end to end, through the real command in a subprocess: what lands on
stdout (nothing unless everything converted), stderr (file:line: field: message), exit codes.
"""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from repocli import cli

HEADER = "apiVersion: reconcile/v1\nkind: Deployment\n"


def write(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(HEADER + f"metadata:\n  name: {name}\n" + body)
    return path


GOOD = "spec:\n  engine: vllm\n  model: org/m\n  devices: {count: 1, kind: nvidia}\n"
CANDIDATES = (
    "spec:\n  engine: vllm\n  model: org/pinned\n"
    "  devices:\n    count: 1\n    kind: nvidia\n    candidates: ['3']\n"
)


def test_the_shipped_engines_export_with_lossy_and_every_object_validates() -> None:
    done = cli("export", "-f", "examples/engines", "--lossy")
    assert done.returncode == 0, done.stderr
    objects = list(yaml.safe_load_all(done.stdout))
    assert len(objects) == 12  # six deployments, each with its Service
    for obj in objects:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    assert "sglang.yaml:19: spec.devices.candidates" in done.stderr  # the line of the field
    assert "dropped (--lossy)" in done.stderr


def test_json_is_one_list_and_namespace_lands_on_every_object(tmp_path: Path) -> None:
    write(tmp_path, "llm", GOOD)
    done = cli("-o", "json", "export", "-f", str(tmp_path), "--namespace", "ml")
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert listing["kind"] == "List"
    assert [(o["kind"], o["metadata"]["namespace"]) for o in listing["items"]] == [
        ("Deployment", "ml"),
        ("Service", "ml"),
    ]
    assert done.stderr == ""


def test_no_faithful_form_exits_1_with_file_line_field_and_the_next_move(tmp_path: Path) -> None:
    write(tmp_path, "good", GOOD)
    path = write(tmp_path, "pinned", CANDIDATES)
    done = cli("export", "-f", str(tmp_path))
    assert done.returncode == 1
    assert done.stdout == ""  # not even the good one: a pipe to kubectl applies nothing
    assert f"error: {path}:11: spec.devices.candidates: no Kubernetes form" in done.stderr
    assert "pass --lossy to drop it" in done.stderr


def test_lossy_drops_it_with_a_warning(tmp_path: Path) -> None:
    path = write(tmp_path, "pinned", CANDIDATES)
    done = cli("export", "-f", str(tmp_path), "--lossy")
    assert done.returncode == 0, done.stderr
    assert f"warning: {path}:11: spec.devices.candidates" in done.stderr
    kinds = [o["kind"] for o in yaml.safe_load_all(done.stdout)]
    assert kinds == ["Deployment", "Service"]


def test_command_without_image_is_an_error_even_lossy(tmp_path: Path) -> None:
    path = write(tmp_path, "cmd", "spec:\n  engine: command\n  command: [serve, '{port}']\n")
    for extra in ((), ("--lossy",)):
        done = cli("export", "-f", str(tmp_path), *extra)
        assert done.returncode == 1 and done.stdout == ""
        assert f"error: {path}:5: spec.image: engine 'command' has no default image" in done.stderr


def test_an_invalid_manifest_fails_as_validate_does(tmp_path: Path) -> None:
    write(tmp_path, "good", GOOD)
    bad = write(tmp_path, "bad", "spec:\n  engine: vllm\n  model: m\n  devcies: {count: 1}\n")
    done = cli("export", "-f", str(tmp_path))
    assert done.returncode == 1 and done.stdout == ""
    assert f"{bad}:8: spec.devcies: unknown field" in done.stderr


@pytest.mark.parametrize(
    "args", [("-o", "table"), ("--namespace", "Not_A_Label")], ids=["format", "namespace"]
)
def test_usage_errors_exit_64(tmp_path: Path, args: tuple[str, ...]) -> None:
    write(tmp_path, "llm", GOOD)
    done = cli("export", "-f", str(tmp_path), *args)
    assert done.returncode == 64 and done.stdout == ""


SCALED = (
    "spec:\n  engine: vllm\n  model: org/m\n  devices: {count: 1, kind: nvidia}\n"
    "  basePort: 8000\n  replicas: 2\n"
    "  autoscale:\n    min: {min}\n    max: 4\n    targetInflight: 4\n"
)


def test_autoscale_exports_an_hpa_and_warns_it_needs_a_metrics_adapter(tmp_path: Path) -> None:
    path = write(tmp_path, "llm", SCALED.replace("{min}", "1"))
    done = cli("export", "-f", str(tmp_path))
    assert done.returncode == 0, done.stderr
    objects = list(yaml.safe_load_all(done.stdout))
    assert [o["kind"] for o in objects] == ["Deployment", "HorizontalPodAutoscaler", "Service"]
    for obj in objects:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    assert objects[1]["spec"]["minReplicas"] == 1 and objects[1]["spec"]["maxReplicas"] == 4
    warning = f"warning: {path}:11: spec.autoscale: exported as an autoscaling/v2"
    assert warning in done.stderr and "prometheus-adapter" in done.stderr


def test_autoscale_min_zero_is_refused_and_lossy_exports_min_one(tmp_path: Path) -> None:
    path = write(tmp_path, "llm", SCALED.replace("{min}", "0"))
    done = cli("export", "-f", str(tmp_path))
    assert done.returncode == 1 and done.stdout == ""
    error = f"error: {path}:12: spec.autoscale.min: no Kubernetes form"
    assert error in done.stderr, done.stderr
    assert "set it to 1, or pass --lossy to export minReplicas: 1" in done.stderr
    lossy = cli("export", "-f", str(tmp_path), "--lossy")
    assert lossy.returncode == 0, lossy.stderr
    hpa = list(yaml.safe_load_all(lossy.stdout))[1]
    assert hpa["spec"]["minReplicas"] == 1
    assert f"warning: {path}:12: spec.autoscale.min" in lossy.stderr
    assert "exported as 1 (--lossy)" in lossy.stderr


def test_a_missing_folder_exits_1_with_nothing_on_stdout(tmp_path: Path) -> None:
    """`export -f typo | kubectl apply -f -` must not go green having applied nothing;
    one folder missing among good ones exports none of them (never half a set)."""
    write(tmp_path / "good", "llm", GOOD)
    done = cli("export", "-f", str(tmp_path / "good"), "-f", str(tmp_path / "nope"))
    assert done.returncode == 1
    assert done.stdout == ""
    assert f"error: manifests folder {tmp_path / 'nope'} does not exist" in done.stderr


# Each warning's field and the line it is written on in KINDS (header: lines 1-4).
KINDS = """\
spec:
  engine: vllm
  model: org/m
  source:
    huggingFace:
      repo: org/m
  envFrom:
    - file: /etc/reconcile/hf.env
  readiness:
    completion: {}
  autoscale:
    min: 0
    max: 2
  devices:
    count: 1
    kind: nvidia
    memory: 20Gi
"""


@pytest.mark.parametrize(
    ("field", "line"),
    [
        pytest.param("spec.source", 8, id="block-mapping-at-its-key"),
        pytest.param("spec.envFrom", 11, id="block-list-at-its-key"),
        pytest.param("spec.readiness.completion", 14, id="flow-mapping"),
        pytest.param("spec.autoscale", 15, id="block-mapping-with-a-scalar-below"),
        pytest.param("spec.autoscale.min", 16, id="scalar-in-a-mapping"),
        pytest.param("spec.devices.memory", 21, id="scalar-last-in-a-mapping"),
    ],
)
def test_each_warning_names_the_line_of_its_field(tmp_path: Path, field: str, line: int) -> None:
    """A field whose value is a block mapping or list was named at the line below its key
    (its value's first line: `spec.autoscale` at `min:`), one line low for the user's
    editor. Every kind of field is named at its key's line."""
    path = write(tmp_path, "kinds", KINDS)
    assert path.read_text().splitlines()[line - 1].lstrip(" -").startswith(field.split(".")[-1])
    done = cli("export", "-f", str(tmp_path), "--lossy")
    assert done.returncode == 0, done.stderr
    assert f"warning: {path}:{line}: {field}: " in done.stderr, done.stderr


def test_deployments_of_one_priority_share_one_priority_class(tmp_path: Path) -> None:
    """A PriorityClass is cluster-wide: two deployments of priority 10 print it once
    (kubectl would apply it twice, and a GitOps tool refuses a duplicate object)."""
    for name in ("a", "b"):
        write(tmp_path, name, GOOD + "  priority: 10\n")
    write(tmp_path, "c", GOOD)
    done = cli("export", "-f", str(tmp_path))
    assert done.returncode == 0, done.stderr
    objects = list(yaml.safe_load_all(done.stdout))
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert kinds == [
        ("PriorityClass", "reconcile-priority-10"),
        ("Deployment", "a"),
        ("Service", "a"),
        ("Deployment", "b"),
        ("Service", "b"),
        ("Deployment", "c"),
        ("Service", "c"),
    ]
    classes = [o["spec"]["template"]["spec"].get("priorityClassName") for o in objects[1::2]]
    assert classes == ["reconcile-priority-10", "reconcile-priority-10", None]
    assert done.stderr.count("spec.priority: exported as a cluster-wide PriorityClass") == 2


def test_strings_kubectl_would_read_as_numbers_or_bools_are_quoted(tmp_path: Path) -> None:
    """PyYAML writes ``1e3``, ``y`` or ``0o17`` plain, as YAML 1.1 strings; kubectl's reader
    (go-yaml: YAML 1.2's floats, its own y/n booleans) takes them for a number or a bool,
    and the API server refuses the object ("cannot unmarshal number into Go struct field
    EnvVar...value of type string"; a trial's label `1e3` was refused so by kubectl)."""
    tricky = ["1e3", "1.5e3", "+2E-1", "y", "N", "0o17", "0b101"]
    env = "".join(f"    TRICKY_{i}: '{value}'\n" for i, value in enumerate(tricky))
    args = ", ".join(f"'{value}'" for value in tricky)
    body = GOOD.replace("spec:\n", "  labels: {scale: '1e3'}\nspec:\n") + (
        f"  args: [{args}]\n  env:\n{env}"
    )
    write(tmp_path, "llm", body)
    done = cli("export", "-f", str(tmp_path))
    assert done.returncode == 0, done.stderr
    for value in tricky:
        assert f"value: '{value}'" in done.stdout and f"- '{value}'" in done.stdout, value
    assert "scale: '1e3'" in done.stdout, done.stdout
    deployment = next(yaml.safe_load_all(done.stdout))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-len(tricky) :] == tricky  # the strings, unchanged
    values = {e["name"]: e["value"] for e in container["env"]}
    assert [values[f"TRICKY_{i}"] for i in range(len(tricky))] == tricky


def test_a_value_with_a_unicode_line_break_reads_back_as_written(tmp_path: Path) -> None:
    """PyYAML wrote NEL (U+0085) raw in a quoted scalar, and a reader (PyYAML, kubectl's
    go-yaml) folds it into a space: an env value or an argument changed on the way."""
    breaks = ["a\x85b", "c\u2028d", "e\u2029f"]
    env = "".join(
        f'    BREAK_{i}: "{v.encode("unicode_escape").decode()}"\n' for i, v in enumerate(breaks)
    )
    body = GOOD + f"  args: [{', '.join(json.dumps(v) for v in breaks)}]\n  env:\n{env}"
    write(tmp_path, "llm", body)
    done = cli("export", "-f", str(tmp_path))
    assert done.returncode == 0, done.stderr
    container = next(yaml.safe_load_all(done.stdout))["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-len(breaks) :] == breaks
    values = {e["name"]: e["value"] for e in container["env"]}
    assert [values[f"BREAK_{i}"] for i in range(len(breaks))] == breaks
