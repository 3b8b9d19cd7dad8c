"""What the benchmarks' peers share: the bundled model's name, the dtype every peer computes in, the settings that
make a peer's variant, and the environment every peer and client runs with. It imports nothing of Ray."""

from __future__ import annotations

import time

from harness.environment import offline_env
from serve_app.engines.cpu import cpu_dtype

MODEL_NAME = "SmolLM2-135M-Instruct"
DTYPE = cpu_dtype()  # what the app computes in here (`vllm.dtype: auto`), so every peer is measured in it
NO_HAPROXY = {"RAY_SERVE_ENABLE_HA_PROXY": "0"}  # over serve.env: Serve's Python proxy on the HTTP port
PYTHON_PROXY = {**NO_HAPROXY, "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}  # and no direct ingress: as before both
ALL_CORES = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}  # vLLM's CPU build then keeps no core for its scheduler
KV_CACHE_GIB = 2  # GiB of KV cache for every vLLM engine on the CPU, the app's too (its `cpu_kvcache_space_gb`)
KV_CACHE = {"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB)}  # what vLLM's own engines read


def env() -> dict[str, str]:
    """The environment of every peer and client: no hub, no usage reporting, not the caller's Ray cluster, the same
    KV cache."""
    return {**offline_env(), **KV_CACHE}


def serve_until_interrupted() -> None:
    """Keep a peer's Serve app up in this process until it is interrupted (its benchmark stops it); then shut down."""
    import ray
    from ray import serve

    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
        ray.shutdown()
