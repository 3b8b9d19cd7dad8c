"""A chat answer as handle methods return it (``chat``, ``chat_stream``'s result, ``chat_batch``'s rows): the
result's dict with what a chat completion's message reads from it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ...engines import GenerationRequest, GenerationResult, TokenLogprob
from ..logprobs import named_by_id
from ..tools import ToolCalls
from .format import Reader, read_output


class Answer:
    """A handle's result dicts for one request: with the prompt's and the generated token ids where asked for
    (chat's ``return_token_ids``); its log probabilities' tokens named by their ids where asked for
    (``return_tokens_as_token_ids``: :meth:`logprobs`); where the request gave tools, its ``content`` and
    ``tool_calls`` (OpenAI's shape) and the finish reason a chat completion would give; where the engine reads
    reasoning, ``content`` and ``reasoning`` (None where ``include_reasoning`` is false)."""

    def __init__(
        self,
        request: GenerationRequest,
        token_ids: bool = False,
        calls: ToolCalls | None = None,
        reader: Reader | None = None,
        include_reasoning: bool = True,
        by_id: bool = False,
    ) -> None:
        self.request, self.token_ids, self.calls = request, token_ids, calls
        self.reader, self.include_reasoning, self.by_id = reader, include_reasoning, by_id

    def logprobs(self, tokens: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        """Log probabilities as dicts, named by their ids where asked for."""
        return [asdict(token) for token in named_by_id(tokens, self.by_id)]

    def result(self, result: GenerationResult) -> dict[str, Any]:
        out = result.to_dict()
        if result.logprobs is not None:
            out["logprobs"] = self.logprobs(result.logprobs)
        if self.token_ids:
            out.update(prompt_token_ids=list(self.request.prompt_token_ids), token_ids=list(result.token_ids))
        if self.calls is None and self.reader is None:
            return out
        thoughts, content, calls, reason = read_output(result, self.calls, self.reader)
        out.update(content=content, finish_reason=reason)
        if self.calls is not None:
            out["tool_calls"] = [call.model_dump() for call in calls]
        if self.reader is not None:
            out["reasoning"] = thoughts if self.include_reasoning else None
        return out
