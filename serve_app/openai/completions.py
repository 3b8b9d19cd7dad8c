"""``POST /v1/completions``: OpenAI's request (plus vLLM's extensions), what of it is refused, and its response
body and stream chunks."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from openai.types import Completion, CompletionChoice
from openai.types.completion_choice import Logprobs
from pydantic import Field

from ..engines import GenerationDelta, GenerationResult, TokenLogprob
from .common import OpenAIRequest, new_id, usage
from .fields import GENERATION_EXTENSIONS
from .logprobs import clamp_logprob, named_by_id, vllm_prompt_logprobs
from .sse import TEXT_MARK, TextEvent
from .types import Refusal, Text, TokenId


class CompletionRequest(OpenAIRequest):
    """OpenAI ``POST /v1/completions``."""

    VLLM_EXTENSIONS: ClassVar[Mapping[str, Any]] = {
        **GENERATION_EXTENSIONS,
        "prompt_embeds": None,
    }

    prompt: Text | list[Text] | list[TokenId] | list[list[TokenId]]
    max_tokens: int | None = Field(None, ge=0, description="new tokens per prompt; 0 only with echo (vLLM's)")
    best_of: int | None = Field(None, ge=1)
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: Text | None = None
    add_special_tokens: bool = True  # vLLM's: false when a text prompt carries its special tokens (BOS) itself

    def refusals(self) -> list[Refusal]:
        out = super().refusals()
        if self.best_of is not None and self.best_of > self.n:
            out.append(("best_of", "best_of above n is not supported"))
        if self.suffix:
            out.append(("suffix", "suffix (insertion) is not supported"))
        if self.max_tokens == 0 and not self.echo:
            out.append(("max_tokens", "0 is allowed only with echo (the prompt alone, and its log probabilities)"))
        return out

    @property
    def echo_only(self) -> bool:
        """``echo`` with ``max_tokens`` 0: the prompt alone comes back (with ``logprobs``, its log probabilities,
        what prompt scoring asks for); as vLLM does, one token is generated and left out."""
        return bool(self.echo) and self.max_tokens == 0

    def logprob_counts(self) -> tuple[int | None, int | None]:
        """``logprobs`` alternatives per token: the generated ones, and the prompt's: ``prompt_logprobs``, else with
        ``echo`` ``logprobs`` (vLLM's)."""
        prompt = self.prompt_logprobs if self.prompt_logprobs is not None else self.logprobs if self.echo else None
        return self.logprobs, prompt

    def prompts(self) -> list[str] | list[list[int]]:
        """The prompts as a list: texts, or token-id lists."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]  # type: ignore[list-item]
        return list(prompt)  # type: ignore[arg-type]


class CompletionLogprobs(Logprobs):
    """A choice's log probabilities: OpenAI's, whose entries may be null where a token has none (the prompt's first
    token, as vLLM's ``CompletionLogProbs`` has it). Built with validation, which pydantic's core does in one pass;
    OpenAI's ``model_construct`` walks every value in Python."""

    token_logprobs: list[float | None] | None = None  # type: ignore[assignment]
    top_logprobs: list[dict[str, float] | None] | None = None  # type: ignore[assignment]


class CompletionChunkChoice(CompletionChoice):
    """A stream chunk's choice: OpenAI's, whose finish reason is null until the choice's last chunk (as vLLM's
    ``CompletionResponseStreamChoice`` has it)."""

    finish_reason: Literal["stop", "length", "content_filter"] | None = None  # type: ignore[assignment]


def finish_reason(result: GenerationResult) -> str:
    """OpenAI's finish reasons for a finished prompt: "length", or "stop" (an end token or a stop string). A
    failed prompt has none: it is answered as an error."""
    return "length" if result.finish_reason == "length" else "stop"


def stop_reason(result: GenerationResult) -> dict[str, int | str]:
    """vLLM's ``stop_reason`` field of a finished choice, where a stop string or stop token id ended it (the
    matched one); nothing otherwise, as the app leaves out fields that would be null."""
    return {} if result.stop_reason is None else {"stop_reason": result.stop_reason}


class CompletionFormat:
    """``/v1/completions`` bodies for one request: ``n`` choices per prompt, each echoing its prompt if asked;
    ``logprobs``: alternatives per token where the request asked for log probabilities (None: it did not);
    ``prompt_ids``: each prompt's token ids where it asked for token ids (vLLM's ``return_token_ids``; None: not);
    ``by_id``: tokens named by their ids in the log probabilities (vLLM's ``return_tokens_as_token_ids``). A
    choice whose result has its prompt's log probabilities (``prompt_logprobs``, or ``echo`` with ``logprobs``)
    has them in vLLM's ``prompt_logprobs`` field too, as vLLM's server gives them."""

    named_events = False  # its stream's events are data only (Responses' are named)

    def __init__(
        self,
        model: str,
        n: int = 1,
        echo: Sequence[str] = (),
        logprobs: int | None = None,
        echo_only: bool = False,
        prompt_ids: Sequence[Sequence[int]] | None = None,
        by_id: bool = False,
    ) -> None:
        self.model, self.n, self.echo, self.logprobs, self.by_id = model, n, list(echo), logprobs, by_id
        self.echo_only = echo_only  # the prompt alone: what was generated is left out (CompletionRequest.echo_only)
        self.prompt_ids = prompt_ids
        self.id, self.created = new_id("cmpl"), int(time.time())
        self._started: set[int] = set()
        self._offsets: dict[int, int] = {}  # each choice's text so far, in characters (a stream's text_offset)
        self._events: dict[int, TextEvent] = {}  # each choice's chunk of text alone, rendered once

    def _prefix(self, index: int) -> str:
        return self.echo[index // self.n] if self.echo else ""

    def _token_ids(
        self, index: int, output: GenerationResult | GenerationDelta | None, first: bool
    ) -> dict[str, list[int]]:
        """vLLM's ``return_token_ids`` fields of a choice: its prompt's ids (a stream's first chunk of it) and the
        generated ones (a chunk's new ones); nothing where the request did not ask."""
        if self.prompt_ids is None:
            return {}
        out = {"prompt_token_ids": list(self.prompt_ids[index // self.n])} if first else {}
        generated = () if self.echo_only or output is None else output.token_ids
        return {**out, "token_ids": list(generated)}

    def _logprobs(self, index: int, tokens: Sequence[TokenLogprob]) -> Logprobs:
        """OpenAI's completions ``logprobs`` for the next ``tokens`` of choice ``index``: as vLLM's server gives
        them, the token's own log probability and the first ``logprobs`` + 1 alternatives; none for a token
        without one (a prompt's first)."""
        tokens = named_by_id(tokens, self.by_id)
        offset = self._offsets.get(index, 0)
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t.token)
        self._offsets[index] = offset
        return CompletionLogprobs(
            text_offset=offsets,
            token_logprobs=[None if t.logprob is None else clamp_logprob(t.logprob) for t in tokens],
            tokens=[t.token for t in tokens],
            top_logprobs=[
                None if t.logprob is None else {k: clamp_logprob(v) for k, v in t.top[: self.logprobs + 1]}  # type: ignore[operator]
                for t in tokens
            ],
        )

    def _choice_logprobs(self, index: int, output: GenerationResult | GenerationDelta, first: bool) -> Logprobs | None:
        if self.logprobs is None:
            return None
        prompt = (output.prompt_logprobs or ()) if self.echo and first else ()
        generated = () if self.echo_only else (output.logprobs or ())
        return self._logprobs(index, [*prompt, *generated])

    def _completion(self, choices: list[CompletionChoice], results: Sequence[GenerationResult] | None) -> Completion:
        extra = {} if results is None else {"usage": usage(results, self.n)}
        return Completion(
            id=self.id, object="text_completion", created=self.created, model=self.model, choices=choices, **extra
        )

    def response(self, results: Sequence[GenerationResult]) -> Completion:
        choices = [
            CompletionChoice(
                index=i,
                text=self._prefix(i) + ("" if self.echo_only else r.text),
                finish_reason=finish_reason(r),
                logprobs=self._choice_logprobs(i, r, first=True),
                **self._token_ids(i, r, first=True),
                **stop_reason(r),
                **({"prompt_logprobs": vllm_prompt_logprobs(r.prompt_logprobs)} if r.prompt_logprobs else {}),
            )
            for i, r in enumerate(results)
        ]
        return self._completion(choices, results)

    def _chunk(
        self, index: int, text: str, reason: str | None, logprobs: Logprobs | None = None, **fields: Any
    ) -> Completion:
        choice = CompletionChunkChoice(index=index, text=text, finish_reason=reason, logprobs=logprobs, **fields)
        return self._completion([choice], None)

    def chunks(self, index: int, delta: GenerationDelta) -> list[Completion]:
        """A delta of choice ``index`` (the first carries the echoed prompt, and with log probabilities the
        prompt's)."""
        first = index not in self._started
        if self.echo_only and not first:
            return []
        self._started.add(index)
        text = "" if self.echo_only else delta.text
        text = self._prefix(index) + text if first else text
        logprobs = self._choice_logprobs(index, delta, first)
        return [self._chunk(index, text, None, logprobs, **self._token_ids(index, delta, first))]

    def text_event(self, index: int, delta: GenerationDelta) -> str | None:
        """The event of :meth:`chunks`' one chunk where it is text alone (a choice's chunks after its first, without
        log probabilities or token ids), from the choice's template; None otherwise."""
        if self.logprobs is not None or self.prompt_ids is not None or self.echo_only or index not in self._started:
            return None
        event = self._events.get(index)
        if event is None:
            event = self._events[index] = TextEvent(self._chunk(index, TEXT_MARK, None))
        return event(delta.text)

    def final_chunks(self, index: int, result: GenerationResult) -> list[Completion]:
        """The chunk that ends choice ``index``, with its finish reason (and the echoed prompt if nothing came
        before it)."""
        first = index not in self._started
        self._started.add(index)
        text = self._prefix(index) if first else ""
        ids = self._token_ids(index, None, first)
        return [self._chunk(index, text, finish_reason(result), **ids, **stop_reason(result))]

    def usage_chunk(self, results: Sequence[GenerationResult]) -> Completion:
        return self._completion([], results)
