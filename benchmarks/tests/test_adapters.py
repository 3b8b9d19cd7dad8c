"""The adapter benchmarks' parts that need no server: both peers get the same four adapters, slots and rank; the
client names them; the routing benchmark's draws are skewed and seeded, and rounds become medians and ratios to no
adapter score."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from benchmarks.adapters.routing import ADAPTERS, app_args, draws, summary
from benchmarks.adapters.serving import NAMES, RANK, RAY, SLOTS, adapter_models, client_argv, peer_settings
from benchmarks.lib.peers import MODEL_NAME
from benchmarks.serving.peers import app_overrides, ray_llm_config
from serve_app.adapters import TARGET_MODULES
from serve_app.config import AppConfig


def test_the_app_and_vllms_server_serve_the_same_adapters_and_the_client_names_them():
    settings = peer_settings(Path("/models/adapter"))
    lora = settings["app"]["fleet"]["lora"]
    assert lora == {"adapters": dict.fromkeys(NAMES, "/models/adapter"), "max_loaded": SLOTS}
    flags = settings["vllm"]["extra"]
    assert flags[flags.index("--max-loras") + 1] == str(SLOTS) and "--enable-lora" in flags
    assert flags[flags.index("--lora-modules") + 1 :] == [f"{name}=/models/adapter" for name in NAMES]
    at = flags.index("--lora-modules")  # the stronger vLLM: LoRA on the adapter's modules alone, as the app's auto
    assert settings["vllm-targets"]["extra"] == [*flags[:at], "--lora-target-modules", *TARGET_MODULES, *flags[at:]]
    argv = client_argv("http://x", Path("/m"), 48, 16, adapter_models("vllm"))
    assert argv[argv.index("--lora-modules") + 1 : argv.index("--lora-modules") + 5] == list(NAMES)
    # Ray Serve LLM's multiplexed adapters: the base model's id, then the adapter's folder in its bucket
    assert adapter_models(RAY) == [f"{MODEL_NAME}:{name}" for name in NAMES]


def test_app_peers_serve_the_base_model_alone_unless_the_benchmark_names_adapters():
    """The shipped config serves the bundled adapter; an app peer measured against vLLM peers without adapters runs
    without LoRA (it costs the base model's steps), and the adapter benchmark's own ``lora`` replaces that."""
    llm, _ = app_overrides("app", None, None)
    assert "lora" in llm and AppConfig.model_validate({"engine": "simulated", **llm}).lora is None
    lora = peer_settings(Path("/models/adapter"))["app"]["fleet"]["lora"]
    llm, _ = app_overrides("app", None, {"lora": lora})
    assert llm["lora"] == lora


def test_ray_serve_llms_lora_gets_vllms_slots_and_rank_and_reads_its_bucket(monkeypatch):
    """Ray Serve LLM's multiplexed LoRA is configured as its users do (``lora_config`` on a cloud folder, the
    engine's LoRA arguments) with the slots and rank vLLM's server gets, and its replicas find the local bucket."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    config = ray_llm_config("/models/base", lora=("s3://adapters", SLOTS, RANK))
    assert config.lora_config.dynamic_lora_loading_path == "s3://adapters"
    assert config.lora_config.max_num_adapters_per_replica == SLOTS
    flags = peer_settings(Path("/models/adapter"))["vllm"]["extra"]
    for flag, key in (
        ("--max-loras", "max_loras"),
        ("--max-cpu-loras", "max_cpu_loras"),
        ("--max-lora-rank", "max_lora_rank"),
    ):
        assert config.engine_kwargs[key] == int(flags[flags.index(flag) + 1])
    assert config.engine_kwargs["enable_lora"] is True
    assert config.runtime_env["env_vars"]["AWS_ENDPOINT_URL_S3"] == "http://127.0.0.1:9"
    plain = ray_llm_config("/models/base")
    assert plain.lora_config is None and "enable_lora" not in plain.engine_kwargs


def test_the_routing_benchmarks_app_is_valid_and_its_draws_are_skewed_and_seeded():
    config = AppConfig.model_validate(app_args(2_000))
    assert config.routing.adapter_weight == 2_000 and config.simulated.adapter_load_s > 0
    counts = Counter(draws(4_000, seed=1))
    assert [counts[a] for a in ADAPTERS] == sorted(counts.values(), reverse=True)  # 1, 1/2, 1/3, 1/4
    assert draws(50, seed=1) == draws(50, seed=1)


def test_rounds_become_medians_and_ratios_to_no_adapter_score():
    def run(weight, k, tok_s, loads):
        return {
            "weight": weight,
            "round": k,
            "tok_s": tok_s,
            "loads_per_min": loads,
            "ttft_p50_s": 0.1,
            "ttft_p99_s": 1.0,
            "wrong_adapter": 0,
        }

    runs = [run(0, 0, 100, 200), run(0, 1, 200, 100), run(8_000, 0, 150, 50), run(8_000, 1, 220, 40)]
    rows = {r["weight"]: r for r in summary(runs, [0, 8_000])}
    assert rows[0]["vs_none"] == 1.0 and rows[8_000]["tok_s"] == 185
    assert rows[8_000]["vs_none"] == (1.5 + 1.1) / 2 and rows[8_000]["loads_vs_none"] == (0.25 + 0.4) / 2
