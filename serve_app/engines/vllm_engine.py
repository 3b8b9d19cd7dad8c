"""The vLLM engine: vLLM's ``AsyncLLM`` (never the blocking offline ``LLM.generate`` inside async code).

Each request streams through ``AsyncLLM.generate`` with its own request id (deltas as they come); vLLM's
continuous batching schedules every request it holds together, and cancelling a stream aborts its request.
Prompts are tokenized by vLLM's own renderer (its tokenizer and chat template, on its thread pool, off the
event loop: no second tokenizer), so a prompt's token count, the batcher's cost, is exactly what vLLM runs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config import LoraSettings, VLLMSettings
from ..config.lora import adapter_folder
from ..errors import RequestError
from .async_llm import (
    AsyncLLMLifecycle,
    has_cuda,
    llm_kv_cache_tokens,
    llm_max_running,
    render_tokens,
    start_async_llm,
    tokenize_prompts,
    tokenize_texts,
)
from .base import (
    Engine,
    EngineDeadError,
    GenerationDelta,
    GenerationOutput,
    GenerationRequest,
    GenerationResult,
    SamplingOptions,
    TokenLogprob,
)
from .parsers import OutputParsers
from .sampling import sampling_params, vllm_logprobs, vllm_refusals

logger = logging.getLogger(__name__)

PACED_STEP_SHARE = 2
"""On a CPU, lower priorities may fill one in this many of a step's tokens while interactive requests are about: a
step's time grows with its tokens there, and a chat waits for the step running when it comes (a trade against the
job's tokens, measured in benchmarks/results/tenancy-history.md)."""


def lora_requests(adapters: dict[str, str], ids: Iterator[int], known: dict[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's ``LoRARequest`` of each adapter, by name: the ``known`` one where there is one, else a new one with
    the next of ``ids`` (an id names one adapter for the engine's lifetime, never reused)."""
    from vllm.lora.request import LoRARequest

    known = known or {}
    return {
        name: known.get(name) or LoRARequest(name, next(ids), adapter_folder(folder))
        for name, folder in adapters.items()
    }


def paced_step_tokens(step_tokens: int) -> int:
    """Lower priorities' tokens a step on a CPU while interactive requests are about: a share of vLLM's step."""
    return max(1, step_tokens // PACED_STEP_SHARE)


class VLLMEngine(AsyncLLMLifecycle, Engine):
    """An ``AsyncLLM`` over one model; on a CPU-only host it runs vLLM's CPU build."""

    name = "vllm"
    returns_logprobs = True
    structures_outputs = True
    detects_repetition = True

    def __init__(
        self,
        model: str,
        settings: VLLMSettings,
        workers_on_gpus: bool = False,
        lora: LoraSettings | None = None,
        served_name: str | None = None,
    ) -> None:
        """``workers_on_gpus``: the engine's workers run in the replica's placement group, on its GPUs (the replica
        process itself then sees none); ``lora``: the adapters a request may run with; ``served_name``: the model's
        name in the engine's metrics (vLLM's ``served_model_name``)."""
        on_gpu = self._on_gpu = workers_on_gpus or has_cuda()
        args = {"scheduling_policy": settings.scheduling_policy, **(lora.engine_args() if lora else {})}
        if served_name:
            args["served_model_name"] = served_name
        args.update(settings.engine_args)
        self._lora_ids = itertools.count(1)
        self._adapters = lora_requests(lora.adapters, self._lora_ids) if lora is not None else {}
        if args.get("enable_lora"):  # list_loras lists its CPU cache: max_cpu_loras (vLLM's default: max_loras)
            self.adapter_slots = int(args.get("max_cpu_loras") or args.get("max_loras") or 1)
        self._priorities = args["scheduling_policy"] == "priority"  # vLLM refuses a request's priority under fcfs
        self.max_model_len = settings.max_model_len
        self._chat_template = Path(settings.chat_template).read_text() if settings.chat_template else None
        parsers = OutputParsers(  # names checked before it starts
            settings.tool_call_parser, settings.reasoning_parser, settings.tool_strict_level
        )
        if settings.reasoning_parser:  # vLLM's grammar then constrains only the answer after the thoughts
            args["reasoning_parser"] = settings.reasoning_parser
        self._llm = start_async_llm(model, settings, on_gpu, args)
        self._dead: BaseException | None = None
        try:
            self.parsers = parsers.over(self._llm.get_tokenizer())
            self.truncation_side = getattr(self._llm.tokenizer, "truncation_side", None) or self.truncation_side
        except ValueError:
            self.close()
            raise
        self._counts = {"requests": 0, "aborts": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0}
        self._running = getattr(self._llm.output_processor, "external_req_ids", None)  # request id -> vLLM's ids
        self.tracks_requests = self._running is not None

    async def _tokenize(self, prompts: list[Any], **params: Any) -> list[Any]:
        return await tokenize_prompts(self._llm, prompts, **params)

    async def encode(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of plain prompts, as vLLM's completions route tokenizes them (with the BOS it adds, unless
        told not to)."""
        return await tokenize_texts(self._llm, texts, add_special_tokens)

    async def encode_chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        template: Mapping[str, Any] | None = None,
    ) -> tuple[list[int], str]:
        """The chat template (the model's, or the ``chat_template`` setting's) with the tools and the call's
        arguments (by default the assistant's generation prompt), rendered and tokenized as vLLM's chat route does
        it; what the template refuses is a 400 in its words, as vLLM's server answers it."""
        from jinja2 import TemplateError
        from vllm.renderers.params import ChatParams

        kwargs: dict[str, Any] = {"add_generation_prompt": True, "continue_final_message": False, **(template or {})}
        if tools:
            kwargs["tools"] = list(tools)
        params = ChatParams(chat_template=self._chat_template, chat_template_kwargs=kwargs)
        try:
            _, prompt = await self._llm.renderer.render_messages_async(list(messages), params)
        except (ValueError, TypeError, TemplateError) as exc:
            raise RequestError(f"the chat template refused the messages: {exc}", param="messages") from exc
        if "prompt_token_ids" not in prompt:
            (prompt,) = await self._tokenize([prompt], add_special_tokens=False, needs_detokenization=True)
        return list(prompt["prompt_token_ids"]), prompt.get("prompt", "")

    async def decode(self, token_ids: Sequence[int]) -> str:
        from vllm.inputs import TokensPrompt

        (prompt,) = await self._tokenize([TokensPrompt(prompt_token_ids=list(token_ids))], needs_detokenization=True)
        return prompt["prompt"]

    def kv_cache_tokens(self) -> int | None:
        """Tokens the KV cache holds: vLLM's block count (known once its engine is up) x block size."""
        return llm_kv_cache_tokens(self._llm)

    def prefix_block_size(self) -> int | None:
        """vLLM's KV block size where its prefix cache is on (its default), else None."""
        cache = self._llm.vllm_config.cache_config
        return cache.block_size if cache.enable_prefix_caching else None

    def max_running(self) -> int | None:
        """vLLM's scheduler cap on running requests (``max_num_seqs``)."""
        return llm_max_running(self._llm)

    def low_priority_step_tokens(self) -> int | None:
        """On a CPU a step's time grows with its tokens, and an interactive request waits for the step running when
        it arrives and then for its own: half of vLLM's step (``max_num_batched_tokens``) for lower priorities.
        None on a GPU, whose decode steps take about as long with one sequence as with hundreds."""
        if self._on_gpu:
            return None
        step = self._llm.vllm_config.scheduler_config.max_num_batched_tokens
        return paced_step_tokens(step)

    def check_sampling(self, sampling: SamplingOptions) -> None:
        """The engine-agnostic checks, then vLLM's own on the ``SamplingParams`` it would run (token ids in
        ``logit_bias`` and ``stop_token_ids`` within the vocabulary, a structured-output constraint its backend can
        compile, a cache salt its server allows...), so that what vLLM would refuse on admission is a 400 before the
        request queues."""
        from vllm.entrypoints.generate.base.protocol import validate_cache_salt

        super().check_sampling(sampling)
        processor = self._llm.input_processor
        configs = processor.model_config, processor.speculative_config, processor.structured_outputs_config

        def verify(options: SamplingOptions) -> None:
            validate_cache_salt(options.cache_salt)  # what vLLM's server allows in one
            params = sampling_params(options)
            params.verify(*configs, processor.tokenizer)
            if processor.tokenizer is not None:  # bad_words: each must tokenize, within the vocabulary
                params.update_from_tokenizer(processor.tokenizer)

        if sampling.structured_outputs is None:
            with vllm_refusals():  # each refusal named by vLLM
                verify(sampling)
            return
        try:  # once, as admission will; a second time only to tell whose fault a refusal is
            with vllm_refusals("structured_outputs"):
                verify(sampling)
        except RequestError:
            with vllm_refusals():  # another field's fault: named by vLLM
                verify(replace(sampling, structured_outputs=None))
            raise  # the constraint's

    def check_token_ids(self, token_ids: Sequence[int], what: str) -> None:
        """vLLM's renderer's own check: every id within the model's (or its tokenizer's) vocabulary."""
        with vllm_refusals(what):
            self._llm.renderer.validate_token_ids(token_ids)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        """``AsyncLLM.generate``'s delta stream; cancelling the iteration aborts the request in vLLM."""
        from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

        if self._dead is not None:
            raise EngineDeadError(f"vLLM engine is dead: {self._dead!r}")
        prompt_tokens = len(request.prompt_token_ids)
        self._counts["requests"] += 1
        parts: list[str] = []
        token_ids: list[int] = []
        finish_reason = cached = written = stop_reason = None
        wanted = request.sampling.logprobs is not None
        logprobs: list[TokenLogprob] = []
        prompt_logprobs = None
        try:
            params = sampling_params(request.sampling)
            prompt = await render_tokens(self._llm, request.prompt_token_ids, request.sampling.cache_salt)
            options: dict[str, Any] = {"priority": request.priority} if self._priorities else {}
            if request.sampling.adapter is not None:
                options["lora_request"] = self._adapters[request.sampling.adapter]
            if request.reasoning_ended is not None:
                options["reasoning_ended"] = request.reasoning_ended
            unsent = None  # the prompt's log probabilities, until a delta carries them
            async for output in self._llm.generate(prompt, params, request.request_id, **options):
                if prompt_logprobs is None and output.prompt_logprobs:  # the first output carries them
                    prompt_logprobs = vllm_logprobs(self._llm, request.prompt_token_ids, output.prompt_logprobs)
                    unsent = prompt_logprobs
                cached = output.num_cached_tokens if output.num_cached_tokens is not None else cached
                written = output.num_cache_creation_tokens if output.num_cache_creation_tokens is not None else written
                if not output.outputs:
                    continue
                completion = output.outputs[0]
                token_ids += completion.token_ids
                if completion.text or completion.token_ids:
                    parts.append(completion.text)
                    new = vllm_logprobs(self._llm, completion.token_ids, completion.logprobs) if wanted else None
                    logprobs += new or ()
                    new_ids = tuple(completion.token_ids)
                    yield GenerationDelta(request.request_id, completion.text, len(token_ids), new, unsent, new_ids)
                    unsent = None
                finish_reason = completion.finish_reason or finish_reason
                stop_reason = completion.stop_reason if completion.stop_reason is not None else stop_reason
        except VLLMEngineDeadError as exc:
            self._dead = exc
            raise EngineDeadError(f"vLLM engine died: {exc}") from exc
        except (asyncio.CancelledError, GeneratorExit):
            self._counts["aborts"] += 1  # AsyncLLM.generate aborted the request on its way out
            raise
        except Exception as exc:  # a request that fails alone (vLLM validation, ...)
            logger.warning("request %s failed: %r", request.request_id, exc)
            yield GenerationResult.failure(request, f"{type(exc).__name__}: {exc}", len(token_ids))
            return
        self._counts["prompt_tokens"] += prompt_tokens
        self._counts["cached_prompt_tokens"] += cached or 0
        yield GenerationResult(
            request.request_id,
            "".join(parts),
            prompt_tokens,
            len(token_ids),
            finish_reason or "abort",
            logprobs=tuple(logprobs) if wanted else None,
            prompt_logprobs=prompt_logprobs,
            token_ids=tuple(token_ids),
            cached_tokens=cached or 0,
            cache_write_tokens=written or 0,
            stop_reason=stop_reason,
        )

    async def set_adapters(self, adapters: dict[str, str]) -> None:
        """vLLM loads an adapter with its first request and keeps the most recently used ones; one that is gone is
        removed from the engine at once."""
        gone = [request for name, request in self._adapters.items() if name not in adapters]
        self._adapters = lora_requests(adapters, self._lora_ids, self._adapters)
        for request in gone:
            await self._llm.remove_lora(request.lora_int_id)

    async def loaded_adapters(self) -> list[str]:
        """vLLM's own list of the adapters it holds (``list_loras``), by their names here."""
        if not self._adapters or self._llm is None or self._dead is not None:
            return []
        held = await self._llm.list_loras()
        return [name for name, request in self._adapters.items() if request.lora_int_id in held]

    def running(self, request_id: str) -> bool:
        """vLLM's output processor holds the request: it drops it with the last output it hands its reader."""
        return request_id in self._running  # type: ignore[operator]

    async def abort(self, request_id: str) -> None:
        if self._dead is None and self._llm is not None:
            self._counts["aborts"] += 1
            await self._llm.abort(request_id)

    def stats(self) -> dict[str, int]:
        """Requests run, aborts received, and the prompt tokens of the requests that finished with how many of them
        vLLM's prefix cache held (their ratio: this engine's prefix-cache hit rate, as vLLM's own metrics count it)."""
        return dict(self._counts)
