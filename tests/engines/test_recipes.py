"""Every engine recipe, rendered: argv, environment, readiness, deadline, ports."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

import pytest

from controller.core.devices.inventory import Device
from controller.core.engines import (
    MODULES,
    CompletionTarget,
    HttpCheck,
    RecipeError,
    RenderContext,
    recipe_for,
)
from controller.core.engines.base import ReadinessChecks
from controller.core.engines.vllm import as_vllm_reads

GPU0 = Device(kind="nvidia", id="0")
GPU1 = Device(kind="nvidia", id="1")
GPU2 = Device(kind="nvidia", id="2")
GPU3 = Device(kind="nvidia", id="3")
AMD0 = Device(kind="amd", id="0")
MAC = Device(kind="apple", id="0")
CPU = Device(kind="cpu", id="0")

HF = "meta-llama/Llama-3.1-8B-Instruct"
GGUF = "/models/tiny.gguf"


def ctx(**kw: object) -> RenderContext:
    base: dict[str, object] = {
        "name": "llm",
        "model": HF,
        "executable": None,
        "host": "127.0.0.1",
        "port": 8000,
        "extra_ports": (29500, 29501),  # as many as any recipe takes (TGI's two)
        "runtime_dir": "/var/lib/reconcile/run/llm",
    }
    base.update(kw)
    return RenderContext(**base)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    id: str
    engine: str
    ctx: RenderContext
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    http: tuple[HttpCheck, ...] = ()
    deadline: float = 600.0


VLLM_READY = (HttpCheck("/health"), HttpCheck("/v1/models", contains=f'"{HF}"'))
VLLM_BASE = ("vllm", "serve", HF, "--host", "127.0.0.1", "--port", "8000")
SGL_BASE = (
    "python3",
    "-m",
    "sglang.launch_server",
    "--model-path",
    HF,
    "--host",
    "127.0.0.1",
    "--port",
    "8000",
    "--nccl-port",
    "29500",
    # SGLang 0.5.19 mounts /metrics only with it (entrypoints/http_server.py)
    "--enable-metrics",
)
TGI_BASE = (
    "text-generation-launcher",
    "--model-id",
    HF,
    "--hostname",
    "127.0.0.1",
    "--port",
    "8000",
    "--shard-uds-path",
    "/var/lib/reconcile/run/llm/tgi-shard",
    "--master-port",
    "29500",
    # v3.3.5's router binds a Prometheus listener there, default 9000 for every launcher
    # (launcher/src/main.rs `prometheus_port`, router/src/server.rs `with_http_listener`)
    "--prometheus-port",
    "29501",
)
LLAMA_BASE = (
    *("llama-server", "-m", GGUF, "--host", "127.0.0.1", "--port", "8000"),
    *("--metrics", "-ngl"),
)
OLLAMA_UP = HttpCheck("/", contains="Ollama is running")

CASES = [
    # --- vLLM ---
    Case(
        "vllm-1gpu",
        "vllm",
        ctx(devices=(GPU0,)),
        VLLM_BASE,
        {"VLLM_PORT": "29500"},
        VLLM_READY,
    ),
    Case("vllm-no-device", "vllm", ctx(), VLLM_BASE, {"VLLM_PORT": "29500"}, VLLM_READY),
    Case(
        "vllm-tp2",
        "vllm",
        ctx(devices=(GPU0, GPU1)),
        (*VLLM_BASE, "--tensor-parallel-size", "2"),
        {"VLLM_PORT": "29500"},
        VLLM_READY,
    ),
    Case(
        "vllm-tp4-args-last",
        "vllm",
        ctx(devices=(GPU0, GPU1, GPU2, GPU3), args=("--max-model-len", "8192")),
        (*VLLM_BASE, "--tensor-parallel-size", "4", "--max-model-len", "8192"),
        {"VLLM_PORT": "29500"},
        VLLM_READY,
    ),
    Case(
        "vllm-served-model-name",
        "vllm",
        ctx(devices=(GPU0,), args=("--served-model-name", "llama")),
        (*VLLM_BASE, "--served-model-name", "llama"),
        {"VLLM_PORT": "29500"},
        (HttpCheck("/health"), HttpCheck("/v1/models", contains='"llama"')),
    ),
    Case(
        "vllm-served-model-name-equals",
        "vllm",
        ctx(args=("--served-model-name=chat",)),
        (*VLLM_BASE, "--served-model-name=chat"),
        {"VLLM_PORT": "29500"},
        (HttpCheck("/health"), HttpCheck("/v1/models", contains='"chat"')),
    ),
    Case(
        "vllm-api-key-probes-health-only",
        "vllm",
        ctx(args=("--api-key", "s3cret")),
        (*VLLM_BASE, "--api-key", "s3cret"),
        {"VLLM_PORT": "29500"},
        (HttpCheck("/health"),),
    ),
    # vLLM v0.11.0 reads a flag's underscores as dashes (FlexibleArgumentParser.parse_args
    # in vllm/utils/__init__.py): the recipe reads spec.args the same way
    Case(
        "vllm-served-model-name-underscores",
        "vllm",
        ctx(args=("--served_model_name", "llama")),
        (*VLLM_BASE, "--served_model_name", "llama"),
        {"VLLM_PORT": "29500"},
        (HttpCheck("/health"), HttpCheck("/v1/models", contains='"llama"')),
    ),
    Case(
        "vllm-api-key-underscores-probes-health-only",
        "vllm",
        ctx(args=("--api_key=s3cret",)),
        (*VLLM_BASE, "--api_key=s3cret"),
        {"VLLM_PORT": "29500"},
        (HttpCheck("/health"),),
    ),
    # ...and, as argparse does (allow_abbrev), a flag's beginning as the flag
    Case(
        "vllm-served-model-name-beginning",
        "vllm",
        ctx(args=("--served-model", "llama")),
        (*VLLM_BASE, "--served-model", "llama"),
        {"VLLM_PORT": "29500"},
        (HttpCheck("/health"), HttpCheck("/v1/models", contains='"llama"')),
    ),
    Case(
        "vllm-api-key-beginning-probes-health-only",
        "vllm",
        ctx(args=("--api-k", "s3cret")),
        (*VLLM_BASE, "--api-k", "s3cret"),
        {"VLLM_PORT": "29500"},
        (HttpCheck("/health"),),
    ),
    Case(
        "vllm-executable",
        "vllm",
        ctx(executable="/opt/venv/bin/vllm", devices=(GPU0,)),
        ("/opt/venv/bin/vllm", *VLLM_BASE[1:]),
        {"VLLM_PORT": "29500"},
        VLLM_READY,
    ),
    # --- llama.cpp ---
    Case(
        "llama-cpu-only",
        "llama-cpp",
        ctx(model=GGUF, extra_ports=()),
        (*LLAMA_BASE, "0"),
        http=(HttpCheck("/health"),),
    ),
    Case(
        "llama-cpu-device",
        "llama-cpp",
        ctx(model=GGUF, extra_ports=(), devices=(CPU,)),
        (*LLAMA_BASE, "0"),
        http=(HttpCheck("/health"),),
    ),
    Case(
        "llama-nvidia",
        "llama-cpp",
        ctx(model=GGUF, extra_ports=(), devices=(GPU0,)),
        (*LLAMA_BASE, "999"),
        http=(HttpCheck("/health"),),
    ),
    Case(
        "llama-amd",
        "llama-cpp",
        ctx(model=GGUF, extra_ports=(), devices=(AMD0,)),
        (*LLAMA_BASE, "999"),
        http=(HttpCheck("/health"),),
    ),
    Case(
        "llama-apple",
        "llama-cpp",
        ctx(model=GGUF, extra_ports=(), devices=(MAC,)),
        (*LLAMA_BASE, "999"),
        http=(HttpCheck("/health"),),
    ),
    Case(
        "llama-executable-and-args",
        "llama-cpp",
        ctx(model=GGUF, extra_ports=(), executable="/opt/llama-server", args=("-c", "512")),
        ("/opt/llama-server", *LLAMA_BASE[1:], "0", "-c", "512"),
        http=(HttpCheck("/health"),),
    ),
    # --- SGLang ---
    Case("sglang-1gpu", "sglang", ctx(devices=(GPU0,)), SGL_BASE, http=(HttpCheck("/health"),)),
    Case(
        "sglang-tp2",
        "sglang",
        ctx(devices=(GPU0, GPU1)),
        (*SGL_BASE, "--tp-size", "2"),
        http=(HttpCheck("/health"),),
    ),
    Case(
        "sglang-venv-python-and-args",
        "sglang",
        ctx(executable="/opt/sgl/bin/python", args=("--mem-fraction-static", "0.8")),
        ("/opt/sgl/bin/python", *SGL_BASE[1:], "--mem-fraction-static", "0.8"),
        http=(HttpCheck("/health"),),
    ),
    # --- TGI ---
    Case("tgi-1gpu", "tgi", ctx(devices=(GPU0,)), TGI_BASE, http=(HttpCheck("/health"),)),
    Case(
        "tgi-4-shards",
        "tgi",
        ctx(devices=(GPU0, GPU1, GPU2, GPU3)),
        (*TGI_BASE, "--num-shard", "4"),
        http=(HttpCheck("/health"),),
    ),
    Case(
        "tgi-executable-and-args",
        "tgi",
        ctx(executable="/usr/local/bin/tgl", args=("--max-total-tokens", "4096")),
        ("/usr/local/bin/tgl", *TGI_BASE[1:], "--max-total-tokens", "4096"),
        http=(HttpCheck("/health"),),
    ),
    # --- Ollama ---
    Case(
        "ollama-no-model",
        "ollama",
        ctx(model=None, extra_ports=()),
        ("ollama", "serve"),
        {"OLLAMA_HOST": "127.0.0.1:8000"},
        (OLLAMA_UP,),
        120.0,
    ),
    Case(
        "ollama-model-gets-latest",
        "ollama",
        ctx(model="llama3", extra_ports=(), devices=(GPU0,)),
        ("ollama", "serve"),
        {"OLLAMA_HOST": "127.0.0.1:8000"},
        (OLLAMA_UP, HttpCheck("/api/tags", contains='"llama3:latest"')),
        120.0,
    ),
    Case(
        "ollama-model-tag-kept",
        "ollama",
        ctx(model="hf.co/bartowski/Qwen:Q4_K_M", extra_ports=()),
        ("ollama", "serve"),
        {"OLLAMA_HOST": "127.0.0.1:8000"},
        (OLLAMA_UP, HttpCheck("/api/tags", contains='"hf.co/bartowski/Qwen:Q4_K_M"')),
        120.0,
    ),
    Case(
        "ollama-ipv6-executable",
        "ollama",
        ctx(model=None, extra_ports=(), host="::1", executable="/usr/bin/ollama"),
        ("/usr/bin/ollama", "serve"),
        {"OLLAMA_HOST": "[::1]:8000"},
        (OLLAMA_UP,),
        120.0,
    ),
    # --- command ---
    Case(
        "command-argv-as-is",
        "command",
        ctx(model=None, extra_ports=(), command=("python3", "-m", "http.server", "8000")),
        ("python3", "-m", "http.server", "8000"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rendered_launch(case: Case) -> None:
    launch = recipe_for(case.engine).launch(case.ctx)
    assert launch.argv == case.argv
    assert dict(launch.env) == case.env
    assert launch.readiness.http == case.http
    assert launch.stop_signal == signal.SIGTERM
    if case.engine != "command":
        assert recipe_for(case.engine).deadline_seconds == case.deadline
        assert launch.readiness.kind == "http"
    else:
        assert launch.readiness == ReadinessChecks()


def test_every_engine_has_a_recipe_with_matching_name() -> None:
    for engine in MODULES:
        recipe = recipe_for(engine)
        assert recipe.engine == engine
        assert recipe.extra_ports >= 0


EXTRA_PORTS = {"vllm": 1, "llama-cpp": 0, "sglang": 1, "tgi": 2, "ollama": 0, "command": 0}


@pytest.mark.parametrize("engine", sorted(EXTRA_PORTS))
def test_extra_ports_declared(engine: str) -> None:
    assert recipe_for(engine).extra_ports == EXTRA_PORTS[engine]


HEALTH = ReadinessChecks(http=(HttpCheck("/health"),))
HEALTH_OF = {
    "vllm": (HEALTH, CompletionTarget("/v1/completions", HF)),
    "sglang": (HEALTH, CompletionTarget("/v1/completions", HF)),
    "tgi": (HEALTH, CompletionTarget("/v1/completions", "tgi")),
    "llama-cpp": (HEALTH, CompletionTarget("/v1/completions", GGUF)),
    "ollama": (
        ReadinessChecks(http=(HttpCheck("/", contains="Ollama is running"),)),
        CompletionTarget("/v1/chat/completions", "llama3:latest"),
    ),
    "command": (None, CompletionTarget("/v1/chat/completions", "llm")),
}


@pytest.mark.parametrize("engine", sorted(HEALTH_OF))
def test_each_recipe_states_its_liveness_check_and_completion_path(engine: str) -> None:
    """The default livenessProbe is the engine's own health path (none for a command);
    a `completion: {}` probe asks the recipe's path for the id the engine serves."""
    model = {"llama-cpp": GGUF, "ollama": "llama3", "command": None}.get(engine, HF)
    launch = recipe_for(engine).launch(ctx(model=model, command=("serve",)))
    assert (launch.liveness, launch.completion) == HEALTH_OF[engine]


def test_a_served_model_name_is_what_a_completion_asks_for() -> None:
    args = ("--served-model-name", "chat")
    for engine in ("vllm", "sglang"):
        assert recipe_for(engine).launch(ctx(args=args)).completion.model == "chat"


@pytest.mark.parametrize(
    ("engine", "args", "model"),
    [
        ("vllm", ("--served-model", "chat"), "chat"),
        ("vllm", ("--served_model=chat",), "chat"),
        ("sglang", ("--served-model", "chat"), "chat"),
        ("sglang", ("--served-model-name=a", "--served-model-name", "b"), "b"),  # the last
        ("sglang", ("--served_model_name", "chat"), HF),  # SGLang keeps underscores
    ],
)
def test_a_completion_asks_for_the_name_the_engine_read(
    engine: str, args: tuple[str, ...], model: str
) -> None:
    """The spellings table (spelling.py) decides which spelling names the model."""
    assert recipe_for(engine).launch(ctx(args=args)).completion.model == model


def test_vllms_own_spelling_of_a_flag_is_read_as_vllm_reads_it() -> None:
    """`--gpu_memory_utilization` is vLLM's `--gpu-memory-utilization`: the user's share
    stands alone (no second one computed), and `--served_model_name.x` keeps its dots."""
    launch = recipe_for("vllm").launch(
        ctx(devices=(Device(kind="nvidia", id="0", memory=80 << 30),), memory=20 << 30,
            args=("--gpu_memory_utilization", "0.5", "--served_model_name=my_model"))
    )  # fmt: skip
    assert "--gpu-memory-utilization" not in launch.argv
    assert launch.completion.model == "my_model"
    assert as_vllm_reads(("--a_b.c_d=e_f", "-x_y", "v_w")) == ("--a-b.c_d=e_f", "-x_y", "v_w")


SHARD_FLAGS = {"vllm": "--tensor-parallel-size", "sglang": "--tp-size", "tgi": "--num-shard"}


@pytest.mark.parametrize("engine", sorted(SHARD_FLAGS))
def test_cpu_devices_are_no_gpus_to_shard_over(engine: str) -> None:
    """`devices: {kind: cpu, count: 2}` got `--tensor-parallel-size 2` (SGLang's
    `--tp-size`, TGI's `--num-shard`): a cpu device is a slot of the node's inventory, and
    the engine, seeing no GPU, would fail to split the model over two."""
    flag = SHARD_FLAGS[engine]
    cpus = (CPU, Device(kind="cpu", id="1"))
    assert flag not in recipe_for(engine).launch(ctx(devices=cpus)).argv
    argv = recipe_for(engine).launch(ctx(devices=(GPU0, GPU1))).argv
    assert argv[argv.index(flag) + 1] == "2"


@pytest.mark.parametrize("engine", ["vllm", "llama-cpp", "sglang", "tgi"])
def test_model_is_required(engine: str) -> None:
    with pytest.raises(RecipeError, match=rf"engine '{engine}' needs spec\.model"):
        recipe_for(engine).launch(ctx(model=None))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi"])
def test_missing_internal_port_is_an_error(engine: str) -> None:
    with pytest.raises(RecipeError, match="reserved internal port"):
        recipe_for(engine).launch(ctx(extra_ports=()))


def _all_ports(engine: str, c: RenderContext) -> set[str]:
    """Every port number and socket path an instance is told to use."""
    launch = recipe_for(engine).launch(c)
    argv = launch.argv
    found = {str(c.port)}
    for flag in ("--port", "--nccl-port", "--master-port", "--prometheus-port", "--shard-uds-path"):
        if flag in argv:
            found.add(argv[argv.index(flag) + 1])
    found.update(
        v.rsplit(":", 1)[-1] for k, v in launch.env.items() if k.endswith(("_PORT", "_HOST"))
    )
    return found


@pytest.mark.parametrize("engine", ["vllm", "llama-cpp", "sglang", "tgi", "ollama"])
def test_two_instances_share_no_port_or_socket(engine: str) -> None:
    """Two instances on one box, given distinct reservations, collide on nothing."""
    n = recipe_for(engine).extra_ports
    a = ctx(
        name="a",
        model=GGUF,
        port=8000,
        extra_ports=tuple(range(20000, 20000 + n)),
        runtime_dir="/state/run/a",
        devices=(GPU0, GPU1),
    )
    b = ctx(
        name="b",
        model=GGUF,
        port=8001,
        extra_ports=tuple(range(20100, 20100 + n)),
        runtime_dir="/state/run/b",
        devices=(GPU2, GPU3),
    )
    ports_a, ports_b = _all_ports(engine, a), _all_ports(engine, b)
    assert len(ports_a) == 1 + n + (engine == "tgi")  # TGI adds its socket path
    assert not ports_a & ports_b


def test_a_tgi_record_reserved_with_one_port_restarts_as_it_ran() -> None:
    """A record leased before --prometheus-port was passed holds one internal port: its
    restart renders what it ran then, rather than refusing a running deployment."""
    launch = recipe_for("tgi").launch(ctx(extra_ports=(29500,)))
    assert launch.argv == TGI_BASE[: TGI_BASE.index("--prometheus-port")]


@pytest.mark.parametrize("host", ["localhost", "gpu-box.lan"])
def test_tgi_refuses_a_host_name_its_router_would_bind_as_every_interface(host: str) -> None:
    """TGI v3.3.5's router parses --hostname as an IP address and binds 0.0.0.0 when it
    is not one (router/src/server.rs: "Invalid hostname, defaulting to 0.0.0.0")."""
    with pytest.raises(RecipeError, match=f"'{host}' is a name: TGI's router would listen"):
        recipe_for("tgi").launch(ctx(host=host))
    launch = recipe_for("tgi").launch(ctx(host="::1"))
    assert launch.argv[launch.argv.index("--hostname") + 1] == "::1"


def test_tgi_rejects_a_socket_path_too_long_for_unix_sockets() -> None:
    with pytest.raises(RecipeError, match="longer than a unix socket allows"):
        recipe_for("tgi").launch(ctx(runtime_dir="/" + "x" * 120))


def test_unknown_engine() -> None:
    with pytest.raises(RecipeError, match="unknown engine 'triton'"):
        recipe_for("triton")


@pytest.mark.parametrize("engine", [e for e in MODULES if e != "command"])
def test_each_recipes_pinned_image_is_named_in_full(engine: str) -> None:
    """The image a container runs without `container.image`: podman refuses a short name
    on a host with no unqualified-search registries (its default), so each names its
    registry (`docker.io/vllm/vllm-openai:v0.11.0`) and pins a tag."""
    import importlib

    image = importlib.import_module(MODULES[engine]).IMAGE
    registry, _, rest = image.partition("/")
    assert "." in registry and "/" in rest and ":" in rest.rsplit("/", 1)[1], image


@pytest.mark.parametrize(
    ("model", "refused"),
    [
        ("Qwen/Qwen2.5-0.5B-Instruct-GGUF", True),
        ("TheBloke/Llama-2-7B-GGUF", True),
        ("/models/tiny.gguf", False),
        ("models/tiny.gguf", False),
        ("./models/tiny", False),
        ("tiny.Q4_K_M.GGUF", False),
    ],
)
def test_llama_cpp_refuses_a_hub_repository_as_its_model_file(model: str, refused: bool) -> None:
    """vLLM's spec.model is a hub id; llama-server's -m is a file, and `-m owner/repo` died at
    every start. The refusal says how to pull a file of that repository instead."""
    recipe = recipe_for("llama-cpp")
    if not refused:
        assert recipe.launch(ctx(model=model)).argv[1:3] == ("-m", model)
        return
    with pytest.raises(RecipeError) as info:
        recipe.launch(ctx(model=model))
    said = str(info.value)
    assert f"{model!r} reads as a Hugging Face repository: pull a file of it with " in said
    assert f"spec.source: {{huggingFace: {{repo: {model}, files: " in said
