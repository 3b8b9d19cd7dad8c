"""The end-to-end benchmark's bare-vLLM peers: the engine settings they build, which need no engine."""

from __future__ import annotations

import os
from unittest import mock

from benchmarks.e2e.settings import engine_settings
from serve_app.engines.async_llm import precision_args


def test_bare_vllm_peers_compute_as_the_app_does():
    """The benchmarks' bare-vLLM peers take their precision from the app's own helper, rotary setting included."""
    assert precision_args("auto", on_gpu=True) == {"dtype": "auto"}  # the model's own dtype, vLLM's own kernels
    assert precision_args("float32", on_gpu=False) == {"dtype": "float32"}
    assert precision_args("bfloat16", on_gpu=False)["compilation_config"] == {"custom_ops": ["-rotary_embedding"]}
    with mock.patch.dict(os.environ):  # engine_settings() sets HF_HUB_OFFLINE: not for later tests
        offline = engine_settings()
    assert {k: offline[k] for k in precision_args("auto", on_gpu=False)} == precision_args("auto", on_gpu=False)
    assert offline["kv_cache_memory_bytes"] == 2 << 30  # serve_config.yaml's cpu_kvcache_space_gb, as the app sets it
