"""What every mode of the end-to-end benchmark shares: the sample prompts, the burst's mixed lengths, and the app's
args and its vLLM engine's settings as serve_config.yaml gives them."""

from __future__ import annotations

import os
import random
from typing import Any

from harness.environment import ROOT

MIN_TOKENS, MAX_TOKENS = 8, 128


def prompts(n: int) -> list[str]:
    from serve_app.sample import make

    return [row["prompt"] for row in make(n, seed=0)]


def burst_requests(n: int, seed: int = 0) -> list[tuple[str, int]]:
    """``n`` (prompt, max_tokens) pairs: sample prompts, max_tokens uniform in 8..128, the same every run."""
    rng = random.Random(seed)
    return [(text, rng.randint(MIN_TOKENS, MAX_TOKENS)) for text in prompts(n)]


def app_args() -> dict[str, Any]:
    """serve_config.yaml's app args as they are, except one replica."""
    import yaml

    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    if "autoscaling" in args:
        args["autoscaling"] = {**args["autoscaling"], "min_replicas": 1, "max_replicas": 1}
    return args


def engine_settings() -> dict[str, Any]:
    """The engine arguments the app's vLLM engine gets from serve_config.yaml (CPU: no GPU here)."""
    from serve_app.engines.async_llm import kv_cache_bytes, precision_args

    vllm = app_args().get("vllm") or {}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    settings = {
        "max_model_len": vllm.get("max_model_len", 2048),
        "kv_cache_memory_bytes": kv_cache_bytes(vllm.get("cpu_kvcache_space_gb", 2)),
        **precision_args(vllm.get("dtype") or "auto", on_gpu=False),  # as the app resolves it on a CPU
        "enforce_eager": True if vllm.get("enforce_eager") is None else vllm["enforce_eager"],
    }
    if vllm.get("max_num_seqs") is not None:
        settings["max_num_seqs"] = vllm["max_num_seqs"]
    settings.update(vllm.get("engine_args") or {})
    return settings
