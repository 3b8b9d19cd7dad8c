"""The one small interface every generation engine hides behind, streaming first: one request in, its outputs out
as they come (text deltas, then a final result with token counts and finish reason). A static-batch engine may
take a whole batch instead. Plus tokenization off the event loop (token costs, context checks), abort, health,
shutdown."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from ..errors import EngineDeadError, RequestError
from .outputs import GenerationDelta, GenerationOutput, GenerationResult, TokenLogprob, coalesce, progress
from .parsers import OutputParsers, OutputReader, ToolReader
from .requests import GenerationRequest, SamplingOptions, StructuredOutputs

__all__ = [
    "Engine",
    "EngineDeadError",
    "GenerationDelta",
    "GenerationOutput",
    "GenerationRequest",
    "GenerationResult",
    "SamplingOptions",
    "StructuredOutputs",
    "TokenLogprob",
    "coalesce",
    "progress",
]


class Engine(abc.ABC):
    """An inference engine behind the batcher; nothing here blocks the event loop.

    A continuous-batching engine (``continuous = True``: vLLM, the simulated one) implements :meth:`stream`
    and gets :meth:`generate` from it; a static-batch engine implements :meth:`generate` and gets a
    one-output :meth:`stream` from it.
    """

    name: str = "engine"
    truncation_side: str = "right"
    """The side its tokenizer truncates a prompt from where a request names none (``right``: keep the first)."""
    continuous: bool = True
    returns_logprobs: bool = False
    """Whether it computes log probabilities (``SamplingOptions.logprobs``); a request for them is refused if not."""
    structures_outputs: bool = False
    """Whether it constrains outputs (``SamplingOptions.structured_outputs``, ``allowed_token_ids``, ``bad_words``); a
    request for it is refused if not."""
    detects_repetition: bool = False
    """Whether it ends a request that repeats itself (``SamplingOptions.repetition_detection``); refused if not."""
    parsers: OutputParsers | None = None
    """vLLM's output parsers over the model's tokenizer, where the engine has both (tool calls, reasoning)."""
    max_model_len: int
    adapter_slots: int = 0
    """How many LoRA adapters it holds loaded at most (what :meth:`loaded_adapters` lists); 0: it serves none."""
    tracks_requests: bool = False
    """Whether :meth:`running` tells if it still runs a request, and its :meth:`stream` joins the deltas a reader that
    fell behind has not taken (vLLM's output collector): then each request's own task reads its stream and the batcher
    only admits it (see :class:`~serve_app.core.streams.Place`)."""

    def check_sampling(self, sampling: SamplingOptions) -> None:
        """Raise :class:`RequestError` naming the field for sampling this engine cannot honour, before the request
        is queued (an engine that refused it only once admitted would answer a client's mistake as a failure)."""
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(sampling, name) is not None and not self.returns_logprobs:
                raise RequestError(f"{name}: the {self.name} engine does not return log probabilities", param=name)
        if sampling.structured_outputs is not None and not self.structures_outputs:
            why = f"structured_outputs: the {self.name} engine does not constrain outputs (structured output)"
            raise RequestError(why, param="structured_outputs")
        limits = {"allowed_token_ids": sampling.allowed_token_ids is not None, "bad_words": bool(sampling.bad_words)}
        for name, given in limits.items():
            if given and not self.structures_outputs:
                raise RequestError(f"{name}: the {self.name} engine does not constrain outputs", param=name)
        if sampling.repetition_detection is not None and not self.detects_repetition:
            why = f"repetition_detection: the {self.name} engine does not detect repetition"
            raise RequestError(why, param="repetition_detection")

    def check_token_ids(self, token_ids: Sequence[int], what: str) -> None:  # noqa: B027 - optional hook
        """Raise :class:`RequestError` if a prompt given as token ids holds one the model does not have."""

    @abc.abstractmethod
    async def encode(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of plain prompts, as the engine will see them (off the event loop: a request may carry
        hundreds of long prompts), with the special tokens (BOS) its tokenizer adds unless told not to."""

    @abc.abstractmethod
    async def encode_chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        template: Mapping[str, Any] | None = None,
    ) -> tuple[list[int], str]:
        """Token ids (and text) of chat messages with the model's chat template and generation prompt; ``tools``:
        OpenAI's tool definitions, for the template to show the model; ``template``: the template call's arguments
        as vLLM's chat route takes them (``add_generation_prompt``, ``continue_final_message`` and the template's own
        variables); a call the template fails is a ``RequestError``."""

    @property
    def reads_tool_calls(self) -> bool:
        """Whether it reads the model's own tool calls from an output (``tool_choice: auto``)."""
        return self.parsers is not None and self.parsers.reads_tool_calls

    @property
    def reads_forced_calls(self) -> bool:
        """Whether a forced call (``tool_choice`` ``required`` or a named function) is made in the model's own
        call format and read by its tool parser, as ``auto``'s are (vLLM's parsers with a structural tag)."""
        return self.parsers is not None and self.parsers.reads_forced_calls

    def tool_constraint(
        self, tools: Sequence[dict[str, Any]], tool_choice: str | dict[str, Any], parallel: bool | None
    ) -> StructuredOutputs | None:
        """What vLLM's tool parser makes a request with ``tools`` match (its ``adjust_request``): a forced call in
        the model's own format, or the envelope and arguments of strict tools; None where it adds nothing or the
        engine has no tool parser."""
        found = None if self.parsers is None else self.parsers.tool_constraint(tools, tool_choice, parallel)
        return None if found is None else StructuredOutputs(**found)

    def tool_call_reader(self, tools: Sequence[dict[str, Any]]) -> ToolReader | None:
        """A reader of the model's own tool calls in outputs to a request with ``tools``, where it has one."""
        return None if self.parsers is None else self.parsers.tool_reader(tools)

    def output_reader(
        self, prompt_token_ids: Sequence[int], tools: Sequence[dict[str, Any]] | None = None
    ) -> OutputReader | None:
        """A reader of one output for a reasoning model's thoughts and (``tools``, ``tool_choice: auto``) the model's
        own calls as they stream, where it has the parsers (:meth:`OutputParsers.output_reader`)."""
        return None if self.parsers is None else self.parsers.output_reader(prompt_token_ids, tools)

    async def decode(self, token_ids: Sequence[int]) -> str:
        """Text of token ids (prompts given as ids, echoed back); engines with a tokenizer override it."""
        raise NotImplementedError(f"the {self.name} engine cannot decode token ids")

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        """One request's outputs as they come: deltas, then one final result. A request that fails alone
        ends with an ``error`` result; raise only when the engine failed (``EngineDeadError`` if gone).
        Cancelling the iteration aborts the request."""
        (result,) = await self.generate([request])
        yield result

    async def generate(self, batch: list[GenerationRequest]) -> list[GenerationResult]:
        """Run a batch; one result per request, in order. Raises when the batch failed as a whole."""
        outcomes = await asyncio.gather(*(self._final(r) for r in batch), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return list(outcomes)

    async def _final(self, request: GenerationRequest) -> GenerationResult:
        result = None
        async for output in self.stream(request):
            result = output
        if not isinstance(result, GenerationResult):
            raise RuntimeError(f"the {self.name} engine's stream ended without a final result")
        return result

    def running(self, request_id: str) -> bool:
        """Whether it still runs ``request_id`` (started, not finished or aborted), where :attr:`tracks_requests`."""
        raise NotImplementedError(f"the {self.name} engine does not track its requests")

    def kv_cache_tokens(self) -> int | None:
        """How many tokens the engine's KV cache holds (sizes an ``auto`` in-flight budget); None: unknown."""
        return None

    def prefix_block_size(self) -> int | None:
        """The block size of the engine's prefix cache, in tokens: requests in flight that share a prompt's leading
        blocks hold them once. None: no prefix cache (each request holds its own)."""
        return None

    def max_running(self) -> int | None:
        """How many requests the engine runs at once (sizes an ``auto`` ``max_inflight``: admitting fewer
        leaves it under-filled, more only queues them inside it, out of the batcher's order); None: unknown."""
        return None

    def low_priority_step_tokens(self) -> int | None:
        """How many tokens of lower priorities' work one of the engine's steps may hold while interactive requests
        are about (an ``auto`` ``batcher.low_priority_step_tokens``); None: no cap, where a step takes about as long
        whatever it holds."""
        return None

    async def abort(self, request_id: str) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Stop a request whose caller went away (its result is then discarded)."""

    async def set_adapters(self, adapters: dict[str, str]) -> None:  # noqa: B027 - no adapters to load by default
        """Serve exactly these LoRA adapters (name -> folder) from now on: new ones load when first asked for,
        the engine forgets the others."""

    async def loaded_adapters(self) -> list[str]:
        """The LoRA adapters the engine holds loaded now (a request for another one loads it first): what the
        token router's adapter score reads from each replica's report."""
        return []

    def stats(self) -> dict[str, int]:
        """The engine's own counters (requests run, aborts received), shown in the replica's stats."""
        return {}

    @abc.abstractmethod
    async def check_health(self) -> None:
        """Raise if the engine cannot serve."""

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release the engine's processes and memory at once, from any thread (idempotent): what a Ray Data
        actor's exit calls."""

    async def shutdown(self) -> None:
        """Release the engine after a replica's drain (without blocking the event loop)."""
        await asyncio.to_thread(self.close)
