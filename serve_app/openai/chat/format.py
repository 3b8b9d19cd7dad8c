"""``POST /v1/chat/completions``'s answers: the response body and the stream's chunks (OpenAI's types), with the
model's thoughts and its tool calls read from the output."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice as ChatChoice
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs
from openai.types.chat.chat_completion_token_logprob import TopLogprob

from ...engines import GenerationDelta, GenerationResult, TokenLogprob
from ...engines.parsers import OutputReader
from ..common import new_id, usage
from ..completions import finish_reason, stop_reason
from ..logprobs import clamp_logprob, named_by_id, vllm_prompt_logprobs
from ..sse import TEXT_MARK, TextEvent
from ..tools import ToolCalls


def _utf8(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def token_logprobs(tokens: Sequence[TokenLogprob], top: int, by_id: bool = False) -> list[ChatCompletionTokenLogprob]:
    """Chat's ``logprobs.content``: each token with its log probability and the first ``top`` alternatives the
    engine returned (vLLM's order); ``by_id``: named ``token_id:<id>``, a token's ``bytes`` still its text's, as
    vLLM's server gives them."""
    return [
        ChatCompletionTokenLogprob(
            token=named.token,
            bytes=_utf8(t.token),
            logprob=clamp_logprob(t.logprob),
            top_logprobs=[TopLogprob(token=k, bytes=_utf8(k), logprob=clamp_logprob(v)) for k, v in named.top[:top]],
        )
        for t, named in zip(tokens, named_by_id(tokens, by_id))
    ]


Reader = Callable[[], OutputReader]
"""A new reader of one output (the engine's parsers over the request's prompt and tools: its thoughts, and, streamed,
the model's own calls)."""


def read_output(
    result: GenerationResult, calls: ToolCalls | None, reader: Reader | None
) -> tuple[str | None, str | None, list[Any], str]:
    """An output's reasoning, content, tool calls and finish reason, as vLLM's server reads them: the reasoning
    parser's split first, then the tool calls in the answer after the thoughts."""
    thoughts, text = reader().split(result.text, result.token_ids) if reader else (None, result.text)
    reason = finish_reason(result)
    if calls is None or text is None:
        return thoughts, text, [], reason
    return thoughts, *calls.answer(text, reason)


class ChatFormat:
    """``/v1/chat/completions`` bodies for one request with ``n`` choices; ``top_logprobs``: alternatives per
    token where the request asked for log probabilities (None: it did not); ``prompt_ids``: the conversation's
    token ids where it asked for token ids (vLLM's ``return_token_ids``; None: not); ``calls``: how its outputs are
    read for tool calls; ``reader``: for thoughts (``include_reasoning: false`` drops them, and the log
    probabilities that would show them, as vLLM does) and the model's own calls as they stream, where the engine
    has the parsers; ``by_id``: tokens named by their ids in the log probabilities (vLLM's
    ``return_tokens_as_token_ids``); the conversation's log probabilities, where its result has them
    (``prompt_logprobs``), in vLLM's ``prompt_logprobs`` field. Streamed, content is held back where the request
    gave tools and the reader does not stream calls (a forced call): it is read whole at the end."""

    named_events = False  # its stream's events are data only (Responses' are named)

    def __init__(
        self,
        model: str,
        n: int = 1,
        top_logprobs: int | None = None,
        prompt_ids: Sequence[int] | None = None,
        calls: ToolCalls | None = None,
        reader: Reader | None = None,
        include_reasoning: bool = True,
        by_id: bool = False,
    ) -> None:
        self.model, self.n, self.by_id = model, n, by_id
        self.top_logprobs = top_logprobs if include_reasoning or reader is None else None
        self.prompt_ids = None if prompt_ids is None else list(prompt_ids)
        self.calls, self.reader, self.include_reasoning = calls, reader, include_reasoning
        self.id, self.created = new_id("chatcmpl"), int(time.time())
        self._started: set[int] = set()
        self._readers: dict[int, OutputReader] = {}
        self._events: dict[int, TextEvent] = {}  # each choice's chunk of content alone, rendered once

    def _answer(self, result: GenerationResult) -> tuple[dict[str, str], str | None, list[Any], str]:
        """A choice's reasoning fields, content, tool calls and finish reason."""
        thoughts, content, calls, reason = read_output(result, self.calls, self.reader)
        return self._thoughts(thoughts), content, calls, reason

    def _thoughts(self, text: str | None) -> dict[str, str]:
        """A message's or delta's reasoning fields: vLLM's ``reasoning``, and ``reasoning_content`` (DeepSeek's API,
        and vLLM's before it), which clients read."""
        return {"reasoning": text, "reasoning_content": text} if text and self.include_reasoning else {}

    def _delta(
        self, index: int, delta: GenerationDelta | None, finished: bool
    ) -> tuple[str | None, str, list[dict[str, Any]]]:
        """The reasoning, content and pieces of tool calls a stream's delta adds."""
        said, ids = (delta.text, delta.token_ids) if delta is not None else ("", ())
        if self.reader is None:
            return None, ("" if self.calls is not None else said), []
        if index not in self._readers:
            self._readers[index] = self.reader()
        reader = self._readers[index]
        thoughts, text, calls = reader.delta(said, ids, finished)
        return thoughts, ("" if self.calls is not None and not reader.reads_calls else text or ""), calls

    def _streams_calls(self, index: int) -> bool:
        return index in self._readers and self._readers[index].reads_calls

    def _logprobs(self, tokens: Sequence[TokenLogprob] | None, kind: type[Any]) -> Any:
        if self.top_logprobs is None or tokens is None:
            return None
        return kind(content=token_logprobs(tokens, self.top_logprobs, self.by_id))

    def _token_ids(self, output: GenerationResult | GenerationDelta | None) -> dict[str, list[int]]:
        """A choice's generated token ids (a chunk's new ones) where the request asked for token ids."""
        return {} if self.prompt_ids is None else {"token_ids": list(output.token_ids if output else ())}

    def _prompt_ids(self) -> dict[str, list[int]]:
        """The conversation's token ids (the body's; a stream's role chunks') where the request asked for them."""
        return {} if self.prompt_ids is None else {"prompt_token_ids": self.prompt_ids}

    def response(self, results: Sequence[GenerationResult]) -> ChatCompletion:
        choices = []
        for i, r in enumerate(results):
            thoughts, content, calls, reason = self._answer(r)
            extra = {"tool_calls": calls} if calls else {}
            message = ChatCompletionMessage(role="assistant", content=content, **extra, **thoughts)
            logprobs = self._logprobs(r.logprobs, ChoiceLogprobs)
            fields = {**self._token_ids(r), **stop_reason(r)}
            choice = ChatChoice(index=i, message=message, finish_reason=reason, logprobs=logprobs, **fields)
            choices.append(choice)
        return ChatCompletion(
            id=self.id,
            object="chat.completion",
            created=self.created,
            model=self.model,
            choices=choices,
            usage=self.token_usage(results),
            **self._prompt_ids(),
            **(
                {"prompt_logprobs": vllm_prompt_logprobs(results[0].prompt_logprobs)}
                if results[0].prompt_logprobs
                else {}
            ),
        )

    def _chunk(self, choices: list[ChunkChoice], **extra: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id, object="chat.completion.chunk", created=self.created, model=self.model, choices=choices, **extra
        )

    def chunks(self, index: int, delta: GenerationDelta | None) -> list[ChatCompletionChunk]:
        """A content delta (with its tokens' log probabilities, and ids, where asked for); the first of each choice
        is preceded by the assistant role, as OpenAI sends it (with the prompt's token ids where asked for)."""
        out = []
        if index not in self._started:
            self._started.add(index)
            role = ChoiceDelta(role="assistant", content="")
            choice = ChunkChoice(index=index, delta=role, finish_reason=None, logprobs=None)
            out.append(self._chunk([choice], **self._prompt_ids()))
        ids = self._token_ids(delta)
        if delta is not None:
            thoughts, text, calls = self._delta(index, delta, finished=False)
            out += self._content(index, thoughts, text, calls, delta.logprobs, ids)
        return out

    def text_event(self, index: int, delta: GenerationDelta) -> str | None:
        """The event of :meth:`chunks`' one chunk where it is content alone (a choice's chunks after its role, with no
        parser reading the output, no calls held back, no log probabilities or token ids), from the choice's
        template; None otherwise."""
        plain = self.reader is None and self.calls is None and self.top_logprobs is None and self.prompt_ids is None
        if not (plain and delta.text and index in self._started):
            return None
        event = self._events.get(index)
        if event is None:
            event = self._events[index] = TextEvent(self._content(index, None, TEXT_MARK, [])[0])
        return event(delta.text)

    def _content(
        self,
        index: int,
        thoughts: str | None,
        text: str,
        calls: list[dict[str, Any]],
        logprobs: Any = None,
        ids: dict[str, list[int]] | None = None,
    ) -> list[ChatCompletionChunk]:
        """A chunk with a delta's reasoning, content and pieces of calls (any may be empty), where it carries
        anything."""
        shown, logprobs = self._thoughts(thoughts), self._logprobs(logprobs, ChunkLogprobs)
        if not (text or shown or calls or logprobs or (ids and ids.get("token_ids"))):
            return []
        pieces = {"tool_calls": [ChoiceDeltaToolCall.model_validate(call) for call in calls]} if calls else {}
        delta = ChoiceDelta(**({"content": text} if text or not (shown or calls) else {}), **shown, **pieces)
        choice = ChunkChoice(index=index, delta=delta, finish_reason=None, logprobs=logprobs, **(ids or {}))
        return [self._chunk([choice])]

    def final_chunks(self, index: int, result: GenerationResult) -> list[ChatCompletionChunk]:
        """The choice's end, with its finish reason: first what the parsers held back; where the request gave tools
        and its calls were not streamed, its content and tool calls, whole, in one delta (OpenAI's shape: each
        call with its index)."""
        ids = self._token_ids(None)  # every id came with the deltas
        out = self.chunks(index, None)
        if self.reader is not None:
            out += self._content(index, *self._delta(index, None, finished=True))
        _, content, calls, reason = self._answer(result)
        if self.calls is not None and not self._streams_calls(index) and (content or calls):
            deltas = [ChoiceDeltaToolCall(index=k, **call.model_dump()) for k, call in enumerate(calls)]
            delta = ChoiceDelta(content=content, **({"tool_calls": deltas} if deltas else {}))
            out.append(self._chunk([ChunkChoice(index=index, delta=delta, finish_reason=None, logprobs=None)]))
        done = ChunkChoice(
            index=index, delta=ChoiceDelta(), finish_reason=reason, logprobs=None, **ids, **stop_reason(result)
        )
        return [*out, self._chunk([done])]

    def usage_chunk(self, results: Sequence[GenerationResult]) -> ChatCompletionChunk:
        return self._chunk([], usage=self.token_usage(results))

    def token_usage(self, results: Sequence[GenerationResult]) -> CompletionUsage:
        """Token usage, with how many were thoughts where the engine reads reasoning (as vLLM's server counts)."""
        counts = [self.reader().reasoning_tokens(r.token_ids) for r in results] if self.reader else [None]
        return usage(results, self.n, None if None in counts else sum(counts))
