"""``POST /v1/completions``: OpenAI's request (plus vLLM's extensions), what of it is refused, and its response
body and stream chunks."""

from __future__ import annotations

import time
from collections.abc import Sequence

from openai.types import Completion, CompletionChoice
from pydantic import Field

from ..engines import GenerationResult
from .common import OpenAIRequest, Refusal, Text, TokenId, new_id, usage


class CompletionRequest(OpenAIRequest):
    """OpenAI ``POST /v1/completions``."""

    prompt: Text | list[Text] | list[TokenId] | list[list[TokenId]]
    best_of: int | None = Field(None, ge=1)
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: Text | None = None

    def refusals(self) -> list[Refusal]:
        out = super().refusals()
        if self.best_of is not None and self.best_of > self.n:
            out.append(("best_of", "best_of above n is not supported"))
        if self.logprobs:
            out.append(("logprobs", "log probabilities are not returned by this server"))
        if self.suffix:
            out.append(("suffix", "suffix (insertion) is not supported"))
        return out

    def prompts(self) -> list[str] | list[list[int]]:
        """The prompts as a list: texts, or token-id lists."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]  # type: ignore[list-item]
        return list(prompt)  # type: ignore[arg-type]


def finish_reason(result: GenerationResult) -> str:
    """OpenAI's finish reasons for a finished prompt: "length", or "stop" (an end token or a stop string). A
    failed prompt has none: it is answered as an error."""
    return "length" if result.finish_reason == "length" else "stop"


class CompletionFormat:
    """``/v1/completions`` bodies for one request: ``n`` choices per prompt, each echoing its prompt if asked."""

    def __init__(self, model: str, n: int = 1, echo: Sequence[str] = ()) -> None:
        self.model, self.n, self.echo = model, n, list(echo)
        self.id, self.created = new_id("cmpl"), int(time.time())
        self._started: set[int] = set()

    def _prefix(self, index: int) -> str:
        return self.echo[index // self.n] if self.echo else ""

    def _completion(self, choices: list[CompletionChoice], results: Sequence[GenerationResult] | None) -> Completion:
        extra = {} if results is None else {"usage": usage(results, self.n)}
        return Completion(
            id=self.id, object="text_completion", created=self.created, model=self.model, choices=choices, **extra
        )

    def response(self, results: Sequence[GenerationResult]) -> Completion:
        choices = [
            CompletionChoice(index=i, text=self._prefix(i) + r.text, finish_reason=finish_reason(r), logprobs=None)
            for i, r in enumerate(results)
        ]
        return self._completion(choices, results)

    def _chunk(self, index: int, text: str, reason: str | None) -> Completion:
        if index not in self._started:
            self._started.add(index)
            text = self._prefix(index) + text
        # A chunk's finish_reason is null until its last one, which OpenAI's (response) model does not allow.
        choice = CompletionChoice.model_construct(index=index, text=text, finish_reason=reason, logprobs=None)
        return self._completion([choice], None)

    def chunks(self, index: int, text: str) -> list[Completion]:
        """A text delta of choice ``index`` (the first carries the echoed prompt)."""
        return [self._chunk(index, text, None)]

    def final_chunks(self, index: int, result: GenerationResult) -> list[Completion]:
        """The chunk that ends choice ``index``, with its finish reason."""
        return [self._chunk(index, "", finish_reason(result))]

    def usage_chunk(self, results: Sequence[GenerationResult]) -> Completion:
        return self._completion([], results)
