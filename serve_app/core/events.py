"""A streamed OpenAI answer's Server-Sent Events, made from the core's outputs (:meth:`Generator.run`): each output
made into its chunks and written as one event string. The replica's streamed answer and the fast-engine benchmark's
``core`` phase both take this loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..engines import GenerationDelta, GenerationOutput, GenerationRequest, GenerationResult
from ..openai.common import stamp_usage
from ..openai.sse import sse
from .generator import succeeded

if TYPE_CHECKING:
    from ..openai.chat import ChatFormat
    from ..openai.completions import CompletionFormat
    from ..openai.responses import ResponsesFormat


async def sse_events(
    outputs: AsyncIterator[tuple[int, GenerationOutput]],
    requests: Sequence[GenerationRequest],
    fmt: CompletionFormat | ChatFormat | ResponsesFormat,
    results: list[Any],
    continuous_usage: bool = False,
    finish: Callable[[list[GenerationResult]], Awaitable[None]] | None = None,
) -> AsyncIterator[str]:
    """The events of ``outputs``, one string for what one output makes (a socket write is most of a chunk's cost).
    Each request's result is put in ``results`` at its index as it comes (a failed one raises
    :class:`~serve_app.errors.GenerationError`); ``finish`` is awaited once every result is in, before the last
    events go out; ``continuous_usage``: each chunk carries its choice's usage so far."""
    named = fmt.named_events  # Responses' events are; a chunk's getattr of a field it lacks costs a raised error
    text_event = None if continuous_usage else getattr(fmt, "text_event", None)  # a chunk of text alone, templated
    async for index, output in outputs:
        if text_event is not None and output.__class__ is GenerationDelta:
            event = text_event(index, output)
            if event is not None:
                yield event
                continue
        if isinstance(output, GenerationResult):
            results[index] = succeeded(output, index)
            chunks = fmt.final_chunks(index, output)
            if finish is not None and all(result is not None for result in results):
                await finish(results)
        else:
            chunks = fmt.chunks(index, output)
        if chunks and continuous_usage:
            stamp_usage(chunks, len(requests[index].prompt_token_ids), output.output_tokens)
        if chunks:
            yield "".join([sse(chunk, chunk.type if named else None) for chunk in chunks])
