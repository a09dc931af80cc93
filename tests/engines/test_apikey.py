"""The API key each engine demands, read as the engine reads it (core/engines/apikey.py)."""

from __future__ import annotations

import pytest

from controller.core.engines.apikey import api_key

CASES = [
    # (engine, args, env, llama.cpp's --api-key-file first key, the key the probe presents)
    ("vllm", ["--api-key", "v"], {}, "", "v"),
    ("vllm", [], {"VLLM_API_KEY": "v"}, "", "v"),
    ("sglang", [], {"VLLM_API_KEY": "v"}, "", ""),
    # TGI v3.3.5: the launcher's `--api-key` (clap `long, env`), handed to the router
    ("tgi", ["--api-key", "t"], {}, "", "t"),
    ("tgi", ["--api-key=t"], {}, "", "t"),
    ("tgi", [], {"API_KEY": "t"}, "", "t"),
    ("tgi", ["--api-key", "flag"], {"API_KEY": "env"}, "", "flag"),  # clap: the flag wins
    ("tgi", ["--api_key", "t"], {}, "", ""),  # clap reads no underscores: TGI refuses it
    ("tgi", [], {"VLLM_API_KEY": "v"}, "", ""),
    # llama.cpp: every key of --api-key, LLAMA_API_KEY and --api-key-file is accepted
    ("llama-cpp", ["--api-key", "a,b"], {}, "f", "a"),
    ("llama-cpp", [], {"LLAMA_API_KEY": "e"}, "f", "e"),
    ("llama-cpp", [], {}, "f", "f"),
    ("ollama", ["--api-key", "o"], {"API_KEY": "o"}, "", ""),
]


@pytest.mark.parametrize(("engine", "args", "env", "file_key", "key"), CASES)
def test_the_key_each_engine_reads(
    engine: str, args: list[str], env: dict[str, str], file_key: str, key: str
) -> None:
    assert api_key(engine, args, env, file_key) == key
