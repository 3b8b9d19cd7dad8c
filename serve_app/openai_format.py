"""OpenAI response bodies, stream chunks and error envelopes, built from engine results with the ``openai``
package's own models, and Server-Sent Events framing (``data: ...``, then ``data: [DONE]``)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice as ChatChoice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta

from .engines import GenerationResult

DONE = "data: [DONE]\n\n"

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    413: "RequestTooLargeError",
    422: "BadRequestError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
    504: "TimeoutError",
}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error envelope, as vLLM's server sends it."""
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "Error"), "param": param, "code": status}}


def sse(payload: Any) -> str:
    """One Server-Sent Event carrying a JSON payload (a pydantic model or a dict)."""
    data = payload.model_dump_json(exclude_unset=True) if hasattr(payload, "model_dump_json") else json.dumps(payload)
    return f"data: {data}\n\n"


def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex}"


def usage(results: Sequence[GenerationResult], n: int = 1) -> CompletionUsage:
    """Token usage: each prompt counted once (every ``n``-th result), every completion counted."""
    prompt = sum(r.prompt_tokens for r in results[::n])
    completion = sum(r.output_tokens for r in results)
    return CompletionUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def finish_reason(result: GenerationResult) -> str:
    """OpenAI's finish reasons are "stop" and "length" here (an aborted request has no caller to answer)."""
    return "length" if result.finish_reason == "length" else "stop"


class CompletionFormat:
    """``/v1/completions`` bodies for one request: ``echo`` prefixes (one per prompt) and ``n``."""

    def __init__(self, model: str, n: int = 1, echo: Sequence[str] = ()) -> None:
        self.model, self.n, self.echo = model, n, list(echo)
        self.id, self.created = new_id("cmpl"), int(time.time())
        self._started: set[int] = set()

    def _prefix(self, index: int) -> str:
        return self.echo[index // self.n] if self.echo else ""

    def response(self, results: Sequence[GenerationResult]) -> Completion:
        choices = [
            CompletionChoice(index=i, text=self._prefix(i) + r.text, finish_reason=finish_reason(r), logprobs=None)
            for i, r in enumerate(results)
        ]
        return Completion(
            id=self.id,
            object="text_completion",
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage(results, self.n),
        )

    def _chunk(self, index: int, text: str, reason: str | None) -> Completion:
        if index not in self._started:
            self._started.add(index)
            text = self._prefix(index) + text
        # A chunk's finish_reason is null until its last one, which OpenAI's (response) model does not allow.
        choice = CompletionChoice.model_construct(index=index, text=text, finish_reason=reason, logprobs=None)
        return Completion(
            id=self.id, object="text_completion", created=self.created, model=self.model, choices=[choice]
        )

    def chunks(self, index: int, text: str) -> list[Completion]:
        """A text delta of choice ``index`` (the first carries the echoed prompt)."""
        return [self._chunk(index, text, None)]

    def final_chunks(self, index: int, result: GenerationResult) -> list[Completion]:
        """The chunk that ends choice ``index``, with its finish reason."""
        return [self._chunk(index, "", finish_reason(result))]

    def usage_chunk(self, results: Sequence[GenerationResult]) -> Completion:
        return Completion(
            id=self.id,
            object="text_completion",
            created=self.created,
            model=self.model,
            choices=[],
            usage=usage(results, self.n),
        )


class ChatFormat:
    """``/v1/chat/completions`` bodies for one request with ``n`` choices."""

    def __init__(self, model: str, n: int = 1) -> None:
        self.model, self.n = model, n
        self.id, self.created = new_id("chatcmpl"), int(time.time())
        self._started: set[int] = set()

    def response(self, results: Sequence[GenerationResult]) -> ChatCompletion:
        choices = [
            ChatChoice(
                index=i,
                message=ChatCompletionMessage(role="assistant", content=r.text),
                finish_reason=finish_reason(r),
                logprobs=None,
            )
            for i, r in enumerate(results)
        ]
        return ChatCompletion(
            id=self.id,
            object="chat.completion",
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage(results, self.n),
        )

    def _chunk(self, choices: list[ChunkChoice], **extra: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id, object="chat.completion.chunk", created=self.created, model=self.model, choices=choices, **extra
        )

    def chunks(self, index: int, text: str) -> list[ChatCompletionChunk]:
        """A content delta; the first of each choice is preceded by the assistant role, as OpenAI sends it."""
        out = []
        if index not in self._started:
            self._started.add(index)
            role = ChoiceDelta(role="assistant", content="")
            out.append(self._chunk([ChunkChoice(index=index, delta=role, finish_reason=None, logprobs=None)]))
        if text:
            delta = ChoiceDelta(content=text)
            out.append(self._chunk([ChunkChoice(index=index, delta=delta, finish_reason=None, logprobs=None)]))
        return out

    def final_chunks(self, index: int, result: GenerationResult) -> list[ChatCompletionChunk]:
        done = ChunkChoice(index=index, delta=ChoiceDelta(), finish_reason=finish_reason(result), logprobs=None)
        return [*self.chunks(index, ""), self._chunk([done])]

    def usage_chunk(self, results: Sequence[GenerationResult]) -> ChatCompletionChunk:
        return self._chunk([], usage=usage(results, self.n))
