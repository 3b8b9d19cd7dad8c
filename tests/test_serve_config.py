"""Configuration validation: a bad value fails at build time, with a message naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from serve_app.app import build_app, deployment_options
from serve_app.config import (
    AUTO_FALLBACK_INFLIGHT,
    AUTO_FALLBACK_TOKENS,
    AppConfig,
    BatchSettings,
    ContinuousSettings,
    EmbeddingConfig,
)

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_are_valid_and_select_the_bundled_model_on_vllm():
    config = AppConfig()
    assert config.engine == "vllm" and config.model == "bundled"
    assert config.model_name == "SmolLM2-135M-Instruct"
    assert config.batcher.mode == "continuous" and config.batcher.max_inflight_tokens == "auto"
    # auto: as many as the engine runs at once, up to vLLM's largest default (1024, an H100 as `vllm serve`)
    assert config.batcher.max_inflight == "auto" and config.max_ongoing_requests >= 1024


@pytest.mark.parametrize("model", [AppConfig, EmbeddingConfig])
def test_a_config_validates_again_from_its_own_dump_as_each_replica_receives_it(model):
    """The app builder validates the YAML's args and hands each replica their dump, which the replica validates
    again: every default (``auto`` included) must pass that second time."""
    config = model()
    assert model.model_validate(config.model_dump()) == config
    assert model.model_validate_json(config.model_dump_json()) == config


def test_auto_max_inflight_is_the_engines_running_cap_with_a_fallback():
    settings = AppConfig().batcher
    assert settings.batcher_kwargs(100_000, 128)["max_inflight"] == 128
    assert settings.batcher_kwargs(100_000, None)["max_inflight"] == AUTO_FALLBACK_INFLIGHT
    assert AppConfig(batcher={"max_inflight": 7}).batcher.batcher_kwargs(100_000, 128)["max_inflight"] == 7


def test_serve_config_yaml_is_valid_and_autoscales_one_to_two_replicas():
    spec = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    app, _ = spec["applications"]
    assert app["import_path"] == "serve_app.app:build_app" and app["route_prefix"] == "/"
    config = AppConfig.model_validate(app["args"])
    assert config.engine == "vllm" and config.model == "bundled"
    assert (config.autoscaling.min_replicas, config.autoscaling.max_replicas) == (1, 2)
    options = deployment_options(config)
    assert options["autoscaling_config"]["max_replicas"] == 2
    assert config.batcher.mode == "continuous"  # the vLLM app admits continuously by default
    assert config.batcher.max_inflight == "auto" and options["max_ongoing_requests"] >= 1024
    assert options["ray_actor_options"]["num_gpus"] == 0  # no Ray cluster with GPUs here
    # Serve's own queue, when capped, sheds with the same 503 + Retry-After as the batcher's.
    assert options["max_queued_requests"] == -1
    assert options["backpressure_config"] == {"status_code": 503, "retry_after_s": 1}
    capped = deployment_options(AppConfig.model_validate({**app["args"], "max_queued_requests": 100}))
    assert capped["max_queued_requests"] == 100


def test_serve_config_yaml_leaves_a_resumed_ray_data_job_its_cpus_on_two_cores():
    """Ray's logical CPUs: on a 2-core machine, with both generation replicas up, a resumed Ray Data job (Ray Data's
    checkpoint filter asks a whole CPU) still fits, as docs/ray-data.md's ``--resume`` needs."""
    from serve_app.data.resume import RESUME_CPUS

    llm, embeddings = (app["args"] for app in yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"])
    config, encoder = AppConfig.model_validate(llm), EmbeddingConfig.model_validate(embeddings)
    held = config.autoscaling.max_replicas * config.cpus_per_replica + encoder.cpus_per_replica
    assert 2 - held >= RESUME_CPUS


def test_serve_config_yaml_serves_the_bundled_adapter_beside_the_base_model():
    """``make serve`` shows the adapters: the shipped file names the bundled adapter, at most two loaded a replica,
    and the token router weighs where an adapter is loaded."""
    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    config = AppConfig.model_validate(args)
    assert config.lora is not None and config.lora.adapters == {"bundled-answer": "bundled"}
    assert config.lora.max_loaded == 2 and config.routing.router == "tokens" and config.routing.adapter_weight > 0


def test_serve_config_yaml_serves_embeddings_beside_generation_on_one_base_url():
    spec = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    app, embeddings = spec["applications"]
    assert embeddings["import_path"] == "serve_app.app:build_embeddings_app"
    assert embeddings["route_prefix"] == "/v1/embeddings"  # the longest prefix wins: the rest goes to the app
    assert AppConfig.model_validate(app["args"]).embeddings_app == embeddings["name"]
    config = EmbeddingConfig.model_validate(embeddings["args"])
    assert config.model_name == "all-MiniLM-L6-v2" and config.engine == "vllm"  # vLLM's pooling runner by default
    assert config.batcher.mode == "continuous" and config.batcher.max_inflight_tokens == "auto"
    assert config.batcher == EmbeddingConfig().batcher  # the file spells out the defaults
    kwargs = config.batcher.batcher_kwargs(4096, 128)  # what the engine says `auto` means
    assert (kwargs["max_inflight_cost"], kwargs["max_inflight"], kwargs["order"]) == (4096, 128, "fifo")
    # engine: padded takes padded batches cut by length by default
    padded = EmbeddingConfig(engine="padded")
    assert padded.batcher.mode == "batch" and padded.batcher.target_batch_tokens == "auto"
    assert padded.batch_tokens("cpu") == 1024 and padded.batch_tokens("cuda") == 16384
    assert padded.batch_overhead("cpu") == 128 and padded.batch_overhead("cuda") == 0  # measured on a CPU only
    kwargs = padded.batcher.batcher_kwargs(padded.batch_tokens("cpu"), True, padded.batch_overhead("cpu"))
    assert kwargs["target_batch_tokens"] == 1024 and kwargs["length_aware"] and kwargs["padded"]
    assert kwargs["batch_overhead"] == 128
    fixed = EmbeddingConfig(engine="padded", batcher={"batch_overhead_tokens": 0}).batcher
    assert fixed.batcher_kwargs(1024, True, 128)["batch_overhead"] == 0  # 0: the budget alone cuts
    # a batcher given in part keeps the engine's own defaults for the rest
    partial = EmbeddingConfig(engine="padded", batcher={"max_batch_size": 16}).batcher
    assert (partial.max_batch_size, partial.batch_timeout_s, partial.order) == (16, 0.005, "length_aware")
    partial = EmbeddingConfig(batcher={"max_inflight": 32}).batcher
    assert (partial.mode, partial.max_inflight, partial.max_queue_size) == ("continuous", 32, 8192)
    options = deployment_options(config)
    assert options["ray_actor_options"] == {"num_cpus": 0, "num_gpus": 0}


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"model": ""}, "model"),
        ({"batcher": {"target_batch_tokens": 0}}, "target_batch_tokens"),
        ({"engine": "padded", "batcher": {"mode": "continuous"}}, "mode"),
        ({"engine": "onnx"}, "engine"),
        ({"vllm": {"max_model_len": 8}}, "max_model_len"),
        ({"dtype": "int4"}, "dtype"),
        ({"max_inputs_per_request": 0}, "max_inputs_per_request"),
        ({"autoscaling": {"min_replicas": 3, "max_replicas": 2}}, "min_replicas"),
    ],
)
def test_bad_embedding_config_fails_at_build_time_naming_the_field(args, field):
    from serve_app.app import build_embeddings_app as build_embeddings

    with pytest.raises(ValidationError, match=field):
        build_embeddings(args)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"engine": "tgi"}, "engine"),
        ({"model": ""}, "model"),
        ({"gpus_per_replica": -1}, "gpus_per_replica"),
        ({"gpus_per_replica": "many"}, "gpus_per_replica"),
        ({"batcher": {"mode": "batch", "max_batch_size": 0}}, "max_batch_size"),
        ({"batcher": {"mode": "batch", "batch_timeout_s": -1}}, "batch_timeout_s"),
        ({"batcher": {"mode": "batch", "target_batch_tokens": "lots"}}, "target_batch_tokens"),
        ({"batcher": {"batch_timeout_s": 0.1}}, "batch_timeout_s"),  # a batch-mode knob in continuous mode
        ({"batcher": {"mode": "batch", "max_inflight": 8}}, "max_inflight"),  # and the other way round
        ({"batcher": {"mode": "batch", "max_batch_size": 64, "max_queue_size": 8}}, "max_queue_size"),
        ({"batcher": {"mode": "static"}}, "mode"),
        ({"batcher": {"max_inflight_tokens": 0}}, "max_inflight_tokens"),
        ({"batcher": {"order": "random"}}, "order"),
        ({"batcher": {"max_batch_sise": 8}}, "max_batch_sise"),
        ({"max_ongoing_requests": 8, "batcher": {"mode": "batch", "max_batch_size": 64}}, "max_ongoing_requests"),
        ({"max_ongoing_requests": 8, "batcher": {"max_inflight": 64}}, "max_ongoing_requests"),
        ({"autoscaling": {"min_replicas": 3, "max_replicas": 2}}, "min_replicas"),
        ({"sampling": {"temperature": 5}}, "temperature"),
        ({"sampling": {"max_tokens": 4096}, "max_tokens_limit": 1024}, "max_tokens"),
        ({"unknown_knob": 1}, "unknown_knob"),
    ],
)
def test_bad_config_fails_at_build_time_naming_the_field(args, field):
    with pytest.raises(ValidationError, match=field):
        build_app(args)


def test_gpus_per_replica_explicit_value_is_used():
    config = AppConfig(engine="vllm", gpus_per_replica=2)
    assert deployment_options(config)["ray_actor_options"]["num_gpus"] == 2
    assert deployment_options(AppConfig(engine="simulated"))["ray_actor_options"]["num_gpus"] == 0


def test_auto_budget_is_the_engines_kv_cache_and_batch_mode_maps_to_token_batcher_knobs():
    continuous = ContinuousSettings()
    assert continuous.batcher_kwargs(45_000, 128)["max_inflight_cost"] == 45_000
    assert continuous.batcher_kwargs(None, 128)["max_inflight_cost"] == AUTO_FALLBACK_TOKENS
    assert ContinuousSettings(max_inflight_tokens=8_192).batcher_kwargs(45_000, 128)["max_inflight_cost"] == 8_192
    batch = BatchSettings(max_batch_size=8, order="length_aware").batcher_kwargs(45_000)
    assert batch["max_batch_size"] == 8 and batch["length_aware"] and "max_inflight_cost" not in batch
    assert batch["target_batch_tokens"] == 32_768  # a number is kept; auto is what the engine says
    assert BatchSettings(target_batch_tokens="auto").batcher_kwargs(45_000)["target_batch_tokens"] == 45_000


def test_the_batcher_is_one_model_per_mode_and_continuous_without_a_mode():
    assert isinstance(AppConfig(batcher={"max_inflight": 3}).batcher, ContinuousSettings)
    assert isinstance(AppConfig(batcher={"mode": "batch"}).batcher, BatchSettings)
    assert not hasattr(AppConfig().batcher, "max_batch_size")


def test_make_serve_runs_with_every_serve_env_setting():
    """Every setting in serve.env reaches `make serve`'s command line (Ray's own lowercase ones included)."""
    import shutil
    import subprocess

    from harness.environment import HAPROXY_SIDE_PORTS, serve_env

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # -n prints the commands without running them; only the serve line is read
    printed = subprocess.run(
        ["make", "-n", "--no-print-directory", "serve"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    serve_line = next(line for line in printed.splitlines() if "serve run serve_config.yaml" in line)
    settings = serve_env()
    assert "RAY_worker_niceness" in settings
    for name, value in settings.items():
        if name in HAPROXY_SIDE_PORTS:  # free ones for a test's or a benchmark's cluster; make serve keeps Ray's
            assert name not in serve_line, name
        else:
            assert f"{name}={value}" in serve_line.split(), name
