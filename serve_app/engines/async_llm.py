"""vLLM's ``AsyncLLM`` as both vLLM engines (generation and pooling) hold it: started with the CPU host prepared
for it (KV cache space, compute threads, the replica yielding its cores), prompts tokenized and rendered by vLLM's
own renderer, and its health and shutdown."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..config import VLLMSettings
from .base import EngineDeadError
from .cpu import cpu_dtype, idle_gloo_threads, yield_cores
from .reaper import in_ray_worker, reap_group_on_exit

logger = logging.getLogger(__name__)


def has_cuda() -> bool:
    """Whether this process sees a CUDA GPU (False when torch is absent or CPU-only)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def resolve_dtype(dtype: str, on_gpu: bool) -> str:
    """``auto`` means the model's own dtype on a GPU and :func:`cpu_dtype` on a CPU."""
    return dtype if dtype != "auto" or on_gpu else cpu_dtype()


def precision_args(dtype: str, on_gpu: bool) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` that set what an engine computes in: ``dtype`` resolved, and on a CPU in a 16-bit
    dtype :data:`CPU_16BIT_CUSTOM_OPS`. The app's engines and the benchmarks' bare-vLLM peers both take them here,
    so a peer computes exactly as the app does."""
    args: dict[str, Any] = {"dtype": resolve_dtype(dtype, on_gpu)}
    if not on_gpu and args["dtype"] in ("bfloat16", "float16"):
        args["compilation_config"] = {"custom_ops": list(CPU_16BIT_CUSTOM_OPS)}  # a fresh list: vLLM appends to it
    return args


CPU_16BIT_CUSTOM_OPS = ("-rotary_embedding",)
"""vLLM's ``compilation_config.custom_ops`` for a CPU engine in a 16-bit dtype: rotary position embeddings in
PyTorch (as transformers computes them) instead of vLLM-CPU's fused kernel, whose 16-bit rounding moved the bundled
model further from float32. With the kernel, greedy answers to 200 sample prompts began with float32's first token
195 times, and "What is the capital of France?" got "L'Etoile, la Marseillaise..."; without it 199 times, and
"Paris", for steps 2-5% longer (docs/cpu-tuning.md)."""


def llm_kv_cache_tokens(llm: Any) -> int | None:
    """Tokens an ``AsyncLLM``'s KV cache holds: vLLM's block count (known once its engine is up) x block size."""
    cache = llm.vllm_config.cache_config
    return cache.num_gpu_blocks * cache.block_size if cache.num_gpu_blocks else None


def llm_max_running(llm: Any) -> int:
    """An ``AsyncLLM``'s scheduler cap on running requests (``max_num_seqs``)."""
    return llm.vllm_config.scheduler_config.max_num_seqs


@contextmanager
def scoped_environ(values: dict[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` inside the block, what was there before after it."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


SMALL_HOST_CORES = 2  # at most this many usable cores: `auto` reserves none for vLLM's scheduler
CPU_SPIN_COUNT = 1_000  # `auto` spins of an idle compute thread (GOMP_SPINCOUNT) when the engine has every core
CPU_STEP_TOKENS = 512  # `auto` tokens in one of vLLM's steps on a CPU (vLLM's own: 2048, seconds a step there)


def reserved_cores(setting: str | int | None, cores: int) -> int | None:
    """``vllm.cpu_reserved_cores`` resolved for a host of ``cores`` usable cores: None keeps vLLM's own default.

    vLLM's CPU build binds one compute thread to each core it does not reserve, and reserves one for its
    scheduler: on a small host that halves the compute (docs/cpu-tuning.md: what none reserved gives); on a larger
    host it costs little and keeps the scheduler off the threads."""
    if setting == "auto":
        return 0 if cores <= SMALL_HOST_CORES else None
    return None if setting is None else int(setting)


def spin_count(setting: str | int | None, reserved: int | None) -> int | None:
    """``vllm.cpu_spin_count`` resolved for an engine that keeps ``reserved`` cores off its compute threads (None:
    vLLM's own reservation, one): None keeps libgomp's own (300,000 spins, many milliseconds).

    Between two parallel regions, and so between two of vLLM's steps, each idle OpenMP thread of the engine busy-
    waits that long before it sleeps. With a core reserved, vLLM's scheduler runs there; with none, the waiting
    threads hold every core between steps, and the engine's own scheduler, the replica and Ray wait for them: on
    2 cores a chat alone saw TTFT p99 1.1-2.5 s at libgomp's default against 0.40 s at 1,000 spins."""
    if setting == "auto":
        return CPU_SPIN_COUNT if reserved == 0 else None
    return None if setting is None else int(setting)


def kv_cache_bytes(gib: float) -> int:
    """vLLM's ``kv_cache_memory_bytes`` for a KV cache of ``gib`` GiB (a CPU host's ``cpu_kvcache_space_gb``)."""
    return int(gib * (1 << 30))


def start_async_llm(
    model: str,
    settings: VLLMSettings,
    on_gpu: bool,
    extra: dict[str, Any] | None = None,
    start_env: dict[str, str] | None = None,
) -> Any:
    """vLLM's ``AsyncLLM`` over ``model`` as ``settings`` say (``extra``: more ``AsyncEngineArgs``, which win), with
    the CPU host prepared for it: its KV cache space, its compute threads, this process yielding the cores to it.
    ``start_env``: environment variables for vLLM's engine processes only (set while they start). Both vLLM
    engines (generation and pooling) start here."""
    if os.path.isdir(model):  # a local folder: never let transformers or vLLM try the hub
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start_env = dict(start_env or {})
    if not on_gpu:
        cores = len(os.sched_getaffinity(0))  # the cores this process (and so its engine) may run on
        reserved = reserved_cores(settings.cpu_reserved_cores, cores)
        if "VLLM_CPU_NUM_OF_RESERVED_CPU" in os.environ:  # set where the engine starts: it wins
            reserved = int(os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"])
        elif reserved is not None:
            start_env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", str(reserved))
        spins = spin_count(settings.cpu_spin_count, reserved)
        if spins is not None and "GOMP_SPINCOUNT" not in os.environ:
            start_env.setdefault("GOMP_SPINCOUNT", str(spins))
        # Unbound (VLLM_CPU_OMP_THREADS_BIND=nobind), the engine takes OMP_NUM_THREADS, which Ray sets to a
        # replica's logical CPUs (1 for num_cpus < 1): it gets the cores it may run on instead.
        threads = settings.cpu_threads if settings.cpu_threads != "auto" else cores
        os.environ["OMP_NUM_THREADS"] = str(threads)
        niceness = os.nice(0)
        if niceness > 0:  # Ray starts its workers at nice 15; the engine's processes inherit it
            logger.warning(
                "this replica runs at nice %d (Ray's worker_niceness) and vLLM's CPU engine inherits it, so "
                "every other process that wakes on the engine's cores runs ahead of the model: set "
                "RAY_worker_niceness=0 where Ray starts (serve.env; `make serve` does)",
                niceness,
            )
    from vllm import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    args: dict[str, Any] = {
        "model": model,
        **precision_args(settings.dtype, on_gpu),
        "enforce_eager": settings.enforce_eager if settings.enforce_eager is not None else not on_gpu,
        "disable_log_stats": True,
    }
    if settings.max_model_len is not None:  # None: the model's own (a pooling model's)
        args["max_model_len"] = settings.max_model_len
    if on_gpu:
        args["gpu_memory_utilization"] = settings.gpu_memory_utilization
    else:  # VLLM_CPU_KVCACHE_SPACE (whole GiB), where set in the environment, wins: vLLM applies it over this
        args["kv_cache_memory_bytes"] = kv_cache_bytes(settings.cpu_kvcache_space_gb)
    if settings.max_num_seqs is not None:
        args["max_num_seqs"] = settings.max_num_seqs
    steps = step_tokens(settings.max_num_batched_tokens, settings.max_num_seqs, on_gpu)
    if steps is not None:
        args["max_num_batched_tokens"] = steps
    args.update(extra or {})
    logger.info("starting vLLM AsyncLLM (%s): %s", "GPU" if on_gpu else "CPU", args)
    # As an OpenAI server: vLLM then sizes max_num_seqs and max_num_batched_tokens as `vllm serve` does (on
    # an H100 1024 and 8192, where its engine-context defaults are 128 and 2048; the same 128/2048 on CPU).
    if in_ray_worker():  # the engine must not outlive this worker, even where the raylet goes first
        reap_group_on_exit()
    with scoped_environ(start_env):  # the engine's processes are spawned (and inherit it) before this returns
        llm = AsyncLLM.from_engine_args(
            AsyncEngineArgs(**args),
            usage_context=UsageContext.OPENAI_API_SERVER,
            stat_loggers=engine_metrics(settings.log_engine_metrics),
        )
    workers = settings.parallelism() * int(settings.engine_args.get("data_parallel_size", 1))
    if not on_gpu and settings.cpu_idle_gloo_threads and workers == 1:  # with more, gloo carries their traffic
        logger.info("vLLM's gloo transport threads now at SCHED_IDLE: %d", idle_gloo_threads())
    if not on_gpu and settings.cpu_replica_niceness > 0:
        # On a CPU the engine's threads compute on every core, and a step waits for its slowest thread, so
        # whatever runs beside them stalls the whole step. The replica's own work (HTTP, streaming,
        # detokenizing) can wait for the gaps between steps. Measured with `vllm bench serve`, 64-request
        # chat bursts on 2 cores, 3 paired rounds: median TTFT 8.6-8.8 s with the replica at nice 0, 7.0-7.5 s
        # at 19, vllm serve 6.7-7.2 s (benchmarks/results/serving.md).
        yield_cores(settings.cpu_replica_niceness)
        logger.info("this process now at nice %d, below its engine's processes", settings.cpu_replica_niceness)
    return llm


def engine_metrics(wanted: bool) -> list[Any] | None:
    """The stat loggers that export vLLM's engine metrics through Ray's (``vllm.log_engine_metrics``), as Ray Serve
    LLM adds them; none outside a Ray worker, where no one would read them (the engine then keeps no statistics)."""
    if not wanted:
        return None
    if not in_ray_worker():
        logger.info("vLLM's engine metrics are not exported: this process is not a Ray worker")
        return None
    from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

    return [RayPrometheusStatLogger]


def step_tokens(setting: str | int | None, max_num_seqs: int | None, on_gpu: bool) -> int | None:
    """``vllm.max_num_batched_tokens`` resolved: a number as given, None for vLLM's own; ``auto``: vLLM's own on a
    GPU, and on a CPU ``CPU_STEP_TOKENS`` (at least ``max_num_seqs``, which vLLM requires), so that no step of
    prompt chunks holds an arriving request up for seconds."""
    if setting != "auto":
        return setting  # type: ignore[return-value]
    return None if on_gpu else max(CPU_STEP_TOKENS, max_num_seqs or 0)


async def tokenize_prompts(llm: Any, prompts: list[Any], **params: Any) -> list[Any]:
    """vLLM's renderer tokenizing (or detokenizing) ``prompts`` on its own thread pool (no second tokenizer)."""
    from vllm.renderers.params import TokenizeParams

    return await llm.renderer.tokenize_prompts_async(prompts, TokenizeParams(None, **params))


async def tokenize_texts(llm: Any, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
    """Token ids of plain texts as vLLM's completions and embeddings routes tokenize them (special tokens added,
    unless told not to)."""
    from vllm.inputs import TextPrompt

    prompts = [TextPrompt(prompt=text) for text in texts]
    prompts = await tokenize_prompts(llm, prompts, add_special_tokens=add_special_tokens)
    return [list(prompt["prompt_token_ids"]) for prompt in prompts]


async def render_tokens(llm: Any, token_ids: list[int], cache_salt: str | None = None) -> Any:
    """A tokenized prompt (its prefix-cache blocks salted with ``cache_salt``) through vLLM's renderer, ready for
    ``generate`` or ``encode`` (raw prompts to them are deprecated)."""
    from vllm.inputs import TokensPrompt
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    prompt = TokensPrompt(prompt_token_ids=token_ids)
    if cache_salt is not None:
        prompt["cache_salt"] = cache_salt
    parsed = parse_model_prompt(llm.model_config, prompt)
    (engine_input,) = await llm.renderer.render_cmpl_async([parsed])
    return engine_input


class AsyncLLMLifecycle:
    """Health and shutdown of an engine that holds vLLM's ``AsyncLLM`` in ``_llm`` and the error that killed it
    in ``_dead``: the generation and the pooling engine alike."""

    _llm: Any
    _dead: BaseException | None

    async def check_health(self) -> None:
        """Raise if vLLM's engine has died."""
        if self._dead is not None:
            raise EngineDeadError(f"vLLM engine is dead: {self._dead!r}")
        try:
            await self._llm.check_health()
        except Exception as exc:
            self._dead = exc
            raise EngineDeadError(f"vLLM engine failed its health check: {exc!r}") from exc

    def close(self) -> None:
        """Shut vLLM's engine processes down (once; vLLM's own ``__del__`` would try again at interpreter exit)."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        self._dead = self._dead or EngineDeadError("shut down")
        llm.shutdown()
