"""The generation application's configuration (its ``args`` in ``serve_config.yaml``), validated when the app is
built, so a bad value fails ``serve run`` at once with a message naming the field."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..models import BUNDLED_NAME
from .batcher import BatcherSettings, ContinuousSettings
from .common import AutoOrCount, AutoOrPositive, DeploymentConfig, ProjectFile, Strict
from .lora import LoraSettings
from .routing import RoutingSettings


class SamplingDefaults(Strict):
    """Sampling used when a request leaves a field out (then vLLM's defaults)."""

    max_tokens: int = Field(128, ge=1, description="new tokens per prompt")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0: greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling")
    stop: list[str] | None = Field(None, description="strings that end a generation")
    seed: int | None = Field(None, description="a seed for reproducible sampling")


class VLLMSettings(Strict):
    """vLLM's engine (``AsyncEngineArgs``); ``engine_args`` passes anything else through."""

    max_model_len: int = Field(2_048, ge=16, description="the context length (on a GPU: the model's, e.g. 8192)")
    dtype: str = Field(
        "auto",
        description="`auto`: the model's dtype on a GPU; on a CPU bfloat16 where it multiplies bfloat16 in hardware "
        "(AMX or AVX512-BF16), float32 elsewhere (where bfloat16 is emulated and slower)",
    )
    enforce_eager: bool | None = Field(None, description="default: true on a CPU, false (CUDA graphs) on a GPU")
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0, description="GPU: the share of memory vLLM takes")
    cpu_kvcache_space_gb: float = Field(
        2,
        gt=0,
        description="CPU-only hosts: the KV cache's memory in GiB (vLLM's kv_cache_memory_bytes); "
        "VLLM_CPU_KVCACHE_SPACE, where set in the environment, wins",
    )
    cpu_threads: Literal["auto"] | int = Field(
        "auto",
        description="CPU-only hosts, with VLLM_CPU_OMP_THREADS_BIND=nobind only: the engine's compute threads "
        "(OMP_NUM_THREADS; `auto`: every usable core). vLLM's default binding runs one thread per core it does not "
        "reserve (`cpu_reserved_cores`)",
    )
    cpu_reserved_cores: AutoOrCount | None = Field(
        "auto",
        description="CPU-only hosts: cores vLLM keeps off its compute threads for its scheduler "
        "(VLLM_CPU_NUM_OF_RESERVED_CPU); null: vLLM's own default, one. `auto`: none on a host of 2 cores or fewer, "
        "where one is half the compute (on 2 cores: 1.44x a chat burst's output tok/s; a batch job 1.51x offline "
        "`LLM.generate` against 0.97x), vLLM's own above",
    )
    cpu_spin_count: AutoOrCount | None = Field(
        "auto",
        description="CPU-only hosts: how long an idle compute thread of the engine busy-waits for more work before it "
        "sleeps (GOMP_SPINCOUNT, in spins; null: libgomp's own, 300,000). `auto`: 1,000 where no core is reserved "
        "(`cpu_reserved_cores`), where the waiting threads would otherwise hold every core between steps and keep "
        "vLLM's scheduler, the replica and Ray waiting (2 cores: a chat's TTFT p99 alone 0.40 s against 1.1-2.5 s); "
        "libgomp's own where a core is reserved",
    )
    cpu_idle_gloo_threads: bool = Field(
        True,
        description="CPU-only hosts, one worker (no tensor, pipeline or data parallelism): torch's gloo transport "
        "threads in vLLM's worker, which then carry nothing but wake 1,300 times a second, run at SCHED_IDLE, so "
        "that they no longer take a core from the model mid-step (2 cores, one text a request to the embedding app: "
        "the compute threads' largest single source of preemptions; docs/cpu-tuning.md)",
    )
    cpu_replica_niceness: int = Field(
        0,
        ge=0,
        le=19,
        description="CPU-only hosts: once its engine is up, the process holding it (a replica or a Ray Data actor: "
        "HTTP, streaming, detokenizing) runs at this niceness; 0 leaves it as it started. 19 lets the engine's "
        "compute on the same cores go first: a little more throughput under bursts, seconds more TTFT under "
        "steady load (docs/cpu-tuning.md)",
    )
    max_num_seqs: int | None = Field(None, ge=1, description="vLLM's running cap; default: as `vllm serve` sizes it")
    max_num_batched_tokens: AutoOrPositive | None = Field(
        "auto",
        description="tokens in one of vLLM's steps, prompt chunks included; null: vLLM's own (2048 on a CPU, 8192 "
        "on a GPU). `auto`: 512 on a CPU-only host (at least `max_num_seqs`), where a step of 2048 prompt tokens "
        "takes seconds and every request arriving waits for it (2 cores: a chat's TTFT p99 beside a batch job 2.45 s "
        "against 7.19 s, a chat burst's output tok/s 1.04x); vLLM's own on a GPU",
    )
    scheduling_policy: Literal["priority", "fcfs"] = Field(
        "priority",
        description="vLLM's scheduler: `priority` runs each request by its priority (lower first) and preempts lower "
        "priorities when the KV cache runs short, as the batcher admits them; `fcfs`: in arrival order",
    )
    chat_template: ProjectFile | None = Field(
        None,
        description="a Jinja chat template file for chat requests in place of the model's own (`vllm serve "
        "--chat-template`), e.g. one that shows the model its tools (`serve_app/templates/chatml_tools.jinja` for "
        "the bundled model); a relative path is taken from the project's folder",
    )
    tool_call_parser: str | None = Field(
        None,
        description="vLLM's parser of the model's own tool-call format (`vllm serve --tool-call-parser`, e.g. "
        "`hermes`): chat requests with tools and `tool_choice: auto` (OpenAI's default) need it; `required` and a "
        "named function do not (structured output). With it, a forced call is made and read in the model's own "
        "format where vLLM's parser does so (hermes: a structural tag), else as vLLM's JSON list of calls",
    )
    tool_strict_level: Literal["auto", "function", "parameter"] = Field(
        "auto",
        description="how far vLLM's tool parser constrains calls (`vllm serve --tool-strict-level`): `auto`, the "
        "call's envelope where `tool_choice` forces one and a tool's arguments where it says `strict: true`; "
        "`function`, the envelope of every call; `parameter`, every tool's arguments too, as if each were strict",
    )
    reasoning_parser: str | None = Field(
        None,
        description="vLLM's parser of a reasoning model's thoughts (`vllm serve --reasoning-parser`, e.g. `qwen3`, "
        "`deepseek_r1`): chat answers then carry them apart from `content`, in `reasoning` (and `reasoning_content`), "
        "and structured output constrains only the answer after them",
    )
    log_engine_metrics: bool = Field(
        True,
        description="vLLM's engine metrics (requests running and waiting, KV cache usage, prefix cache hits, TTFT, "
        "inter-token latency, ...) on Ray's Prometheus endpoint as `ray_vllm_*`, as Ray Serve LLM's "
        "`log_engine_metrics` exports them (docs/metrics.md); false: the engine keeps no statistics, a little less "
        "CPU per token",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="anything else for `vllm.AsyncEngineArgs` (e.g. tensor_parallel_size)"
    )

    def parallelism(self) -> int:
        """The engine's workers: vLLM's tensor_parallel_size x pipeline_parallel_size (``engine_args``)."""
        args = self.engine_args
        return int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))


class SimulatedSettings(Strict):
    """The SIMULATED engine (no model, for tests and benchmarks): deterministic text, time from a cost model.
    Continuous by default: each step advances every running sequence one token and takes `step_s +
    step_s_per_seq` x sequences `+ step_s_per_token` x context tokens `+ prefill_s_per_token` x new prompt tokens.
    `padded: true` makes it a static batch engine instead."""

    max_model_len: int = Field(2_048, ge=16, description="the context length")
    batch_overhead_s: float = Field(0.0, ge=0.0, description="padded: seconds per batch")
    prefill_s_per_token: float = Field(0.0, ge=0.0, description="seconds per prompt token entering")
    step_s: float = Field(0.0, ge=0.0, description="seconds per step")
    step_s_per_seq: float = Field(0.0, ge=0.0, description="seconds per step and running sequence")
    step_s_per_token: float = Field(0.0, ge=0.0, description="seconds per step and token in the running contexts")
    max_num_seqs: int = Field(256, ge=1, description="sequences running at once (vLLM's max_num_seqs)")
    kv_cache_tokens: int = Field(65_536, ge=1, description="the simulated KV cache (sizes an `auto` budget)")
    padded: bool = Field(False, description="a static, padded batch engine instead of a continuous one")
    prefix_caching: bool = Field(
        False,
        description="a prefix cache as vLLM's (on by default there): a prompt's leading 16-token blocks still held "
        "from earlier prompts (at most `kv_cache_tokens`, the least recently used go) skip `prefill_s_per_token`, "
        "answers report them as cached tokens, and admission counts a prompt's blocks that requests in flight share "
        "once (`batcher.shared_prefixes`). Off: every prompt is prefilled whole",
    )
    adapter_load_s: float = Field(
        0.0,
        ge=0.0,
        description="seconds a step takes longer for each LoRA adapter it loads: the engine holds `lora.max_loaded` "
        "(the least recently used goes), and a step runs at most that many (the others wait, as in vLLM)",
    )
    fail_marker: str | None = Field(
        "__simulated_fail__", description="a prompt containing it fails (tests of the error paths)"
    )
    die_marker: str | None = Field(
        "__simulated_die__", description="a prompt containing it kills the engine (tests of health checks)"
    )
    raise_marker: str | None = Field(
        "__simulated_raise__", description="a batch holding it raises after running (tests of failure isolation)"
    )
    replies: list[str] = Field(
        default_factory=list,
        description="replies a prompt asks for by number with `reply_marker` (tests of what a model writes: tool "
        "calls, reasoning): said token by token, ending there (finish reason `stop`) or at `max_tokens`",
    )
    reply_marker: str = Field(
        "__simulated_reply__",
        min_length=1,
        description="a prompt holding it and a number K is answered with `replies[K]` (the last K it holds)",
    )
    tokenizer: bool = Field(
        False,
        description="tokenize with the model's own tokenizer (`model`) in place of 4 characters a token, so that "
        "vLLM's parsers (`vllm.tool_call_parser`, `vllm.reasoning_parser`) read its replies",
    )


class PlacementSettings(Strict):
    """A replica whose engine spans several devices (vLLM's tensor or pipeline parallelism) gets a placement group:
    one bundle per engine worker, the replica's own CPUs added to the first (the replica runs there, as Ray Serve LLM
    places it), and vLLM's Ray executor puts its workers in the bundles."""

    bundle_per_worker: dict[str, float] = Field(
        default_factory=lambda: {"GPU": 1.0, "CPU": 1.0}, description="the resources of each engine worker's bundle"
    )
    workers: AutoOrPositive = Field(
        "auto", description="bundles; `auto`: vLLM's tensor_parallel_size x pipeline_parallel_size (`engine_args`)"
    )
    strategy: Literal["STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD"] = Field(
        "STRICT_PACK",
        description="`STRICT_PACK`: all on one node (tensor parallelism); `PACK` or `SPREAD` across nodes for "
        "multi-node pipeline parallelism",
    )

    @field_validator("bundle_per_worker")
    @classmethod
    def _resources(cls, value: dict[str, float]) -> dict[str, float]:
        if not value or any(amount < 0 for amount in value.values()) or not any(value.values()):
            raise ValueError("placement.bundle_per_worker: resources >= 0, at least one of them > 0")
        return value


class AppConfig(DeploymentConfig):
    """The generation application: ``serve_config.yaml``'s ``args`` for ``serve_app.app:build_app``."""

    BUNDLED_NAME = BUNDLED_NAME

    engine: Literal["vllm", "simulated"] = Field(
        "vllm", description="`vllm`, or `simulated` (no model: the batching and serving logic, for tests)"
    )
    embeddings_app: str | None = Field(
        None, description="the Serve app serving /v1/embeddings beside this one; /v1/models lists its model too"
    )
    max_prompts_per_request: int = Field(256, ge=1, description="prompts (x n) in one request")
    max_tokens_limit: int = Field(1_024, ge=1, description="the largest max_tokens a request may ask for")
    max_prompt_chars: int = Field(200_000, ge=1, description="the longest prompt text accepted, before tokenizing")
    sampling: SamplingDefaults = Field(default_factory=SamplingDefaults)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    placement: PlacementSettings | None = Field(
        None, description="a placement group per replica, for engines on several devices (see `placement.*`)"
    )
    batcher: BatcherSettings = Field(default_factory=ContinuousSettings)
    vllm: VLLMSettings = Field(default_factory=VLLMSettings)
    simulated: SimulatedSettings = Field(default_factory=SimulatedSettings)
    lora: LoraSettings | None = Field(None, description="LoRA adapters a request names in `model` (see `lora.*`)")

    @model_validator(mode="after")
    def _consistent(self) -> AppConfig:
        # Serve caps a replica's concurrent requests at max_ongoing_requests; below the engine's batch,
        # single-prompt requests could never fill it (Ray only warns about this; we refuse).
        batcher = self.batcher
        field, needed = (
            ("batcher.max_batch_size", batcher.max_batch_size)
            if batcher.mode == "batch"
            else ("batcher.max_inflight", batcher.max_inflight)
        )
        if needed != "auto" and self.max_ongoing_requests < needed:  # auto: the engine's own cap, known once up
            raise ValueError(
                f"max_ongoing_requests ({self.max_ongoing_requests}) must be >= {field} ({needed}), "
                "or the engine can never be filled"
            )
        if self.placement is not None:
            self._check_placement(self.placement)
        if self.lora is not None and self.model_name in self.lora.adapters:
            raise ValueError(f"lora.adapters: {self.model_name!r} is the base model's name")
        if self.sampling.max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"sampling.max_tokens ({self.sampling.max_tokens}) must be <= max_tokens_limit "
                f"({self.max_tokens_limit})"
            )
        return self

    def parallelism(self) -> int:
        """The engine's workers: vLLM's tensor_parallel_size x pipeline_parallel_size."""
        return self.vllm.parallelism()

    def _check_placement(self, placement: PlacementSettings) -> None:
        if placement.workers != "auto" and placement.workers != self.parallelism():
            raise ValueError(
                f"placement.workers ({placement.workers}) must be vLLM's tensor_parallel_size x pipeline_parallel_size "
                f"({self.parallelism()}): one bundle per engine worker"
            )
        if self.gpus_per_replica not in ("auto", 0):
            raise ValueError(
                "gpus_per_replica must be auto or 0 with a placement group: the engine's workers hold the GPUs, "
                "in placement.bundle_per_worker"
            )

    @property
    def routes_by_tokens(self) -> bool:
        """Whether callers pick a replica with the token router: ``routing.router: tokens`` and more than one
        replica to pick from. With at most one, Serve's own router picks the same replica, and under HAProxy no
        request pays the hop to the ingress router first."""
        return self.routing.router == "tokens" and self.autoscaling.max_replicas > 1

    @property
    def max_model_len(self) -> int:
        """The context length of the selected engine."""
        return self.vllm.max_model_len if self.engine == "vllm" else self.simulated.max_model_len
