"""The generation deployment's ``DeploymentHandle`` methods (``handle.<method>.remote(...)``), over its core as its
HTTP routes are.

- ``generate(prompt, **sampling) -> dict``: one prompt; raises if it fails.
- ``generate_batch(prompts, **sampling) -> list[dict]``: one dict per prompt, in order, each with an ``error``
  (None on success): a prompt that is refused or fails does not fail the others.
- ``chat(messages, **fields) -> dict``: chat messages, with the model's chat template (any chat completions field,
  ``priority`` and ``user`` included; ``tenant`` is ``user``).
- ``generate_stream(prompt, **sampling)`` and ``chat_stream(messages, **fields)``: generators; call them with
  ``handle.options(stream=True)``. They yield ``{"type": "delta", "text", "output_tokens"}`` as tokens come, then
  one ``{"type": "result", ...}`` (the dict ``generate`` returns), or raise if the prompt fails. ``chat`` and
  ``chat_stream`` with ``return_token_ids=True`` add ``token_ids`` (each delta's new ones; the result's all, and
  its ``prompt_token_ids``); with ``tools``, the result adds ``content`` and ``tool_calls`` (OpenAI's shape); with
  the app's ``reasoning_parser``, ``content`` and ``reasoning`` (the model's thoughts).
- ``stats() -> dict``: the core's statistics and the replica's identity.

Every method takes ``priority`` (vLLM's meaning: lower runs first; interactive calls 0, Ray Data jobs larger)
and ``tenant`` (whose fair share the request counts against). Failures reach handle callers as the exceptions of
:mod:`serve_app.errors` (bad input: ``RequestError``, a ``ValueError``; a failed prompt: ``GenerationError``; a
full queue: ``batching.QueueFullError``; ...).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ..core import Generator, parse
from ..core.base import check_batch
from ..core.generator import succeeded
from ..core.rows import answer_rows, chat_error_row
from ..engines import GenerationDelta, GenerationRequest, GenerationResult
from ..errors import RequestError
from ..openai.chat import Answer, ChatCompletionRequest, Reader
from ..openai.common import Origin, SamplingFields
from ..openai.tools import ToolCalls


def origin(priority: Any, tenant: Any) -> Origin:
    """A handle call's ``priority`` and ``tenant``, checked (a ``ValueError`` naming a bad one)."""
    return parse(Origin, {"priority": priority, "tenant": tenant})


class HandleMethods:
    """The handle methods of :class:`~serve_app.serving.llm.LLMServer`, which gives them its core and its readers of
    tool calls and thoughts."""

    core: Generator

    def _tool_calls(self, body: ChatCompletionRequest) -> ToolCalls | None:
        raise NotImplementedError

    def _reader(self, body: ChatCompletionRequest, request: GenerationRequest) -> Reader | None:
        raise NotImplementedError

    async def _prompt(self, prompt: Any, sampling: dict[str, Any], priority: Any, tenant: Any) -> list[Any]:
        requests = self.core.requests
        sampling_options = requests.sampling(parse(SamplingFields, sampling))
        return await requests.prompts([prompt], sampling_options, origin=origin(priority, tenant))

    async def _chat(self, messages: Any, fields: dict[str, Any]) -> tuple[list[GenerationRequest], Answer]:
        """The conversation's request, and how its result dicts are made. A keyword the body does not know is
        refused here (over HTTP it would be ignored): in Python it is a typo."""
        if "tenant" in fields:
            fields = {"user": fields.pop("tenant"), **fields}
        if unknown := sorted(fields.keys() - ChatCompletionRequest.known_fields()):
            raise RequestError(f"unknown keyword argument(s): {', '.join(unknown)}", param=unknown[0])
        body = parse(ChatCompletionRequest, {**fields, "messages": messages, "stream": False})
        requests = (await self.core.requests.chat_completion(body))[:1]
        reader = self._reader(body, requests[0])
        by_id = bool(body.return_tokens_as_token_ids)
        return requests, Answer(
            requests[0], bool(body.return_token_ids), self._tool_calls(body), reader, body.include_reasoning, by_id
        )

    async def generate(self, prompt: str, *, priority: int = 0, tenant: str | None = None, **sampling: Any) -> Any:
        """Generate for one prompt; raises if it fails."""
        (result,) = await self.core.complete(await self._prompt(prompt, sampling, priority, tenant))
        return result.to_dict()

    async def generate_batch(
        self, prompts: list[str], *, priority: int = 0, tenant: str | None = None, **sampling: Any
    ) -> list[dict[str, Any]]:
        """Generate for each prompt; one dict per prompt, in order, with ``error`` set where it was refused or
        failed."""
        return await self.core.rows(prompts, sampling, origin(priority, tenant))

    async def chat(self, messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        """Answer a conversation (OpenAI-style messages; any chat completions field as a keyword)."""
        requests, answer = await self._chat(messages, fields)
        (result,) = await self.core.complete(requests)
        return answer.result(result)

    async def chat_batch(self, conversations: list[list[dict[str, Any]]], **fields: Any) -> list[dict[str, Any]]:
        """Answer each conversation with the same chat fields (a Ray Data chat job's batch); one dict per
        conversation, in order, as :meth:`chat` gives it, with ``error`` set where it was refused or failed."""
        limit = self.core.config.max_prompts_per_request
        check_batch(conversations, "conversations", "conversations", limit, of="message lists")
        built: list[tuple[list[GenerationRequest], Answer] | RequestError] = []
        for messages in conversations:
            try:
                built.append(await self._chat(messages, fields))
            except RequestError as exc:
                built.append(exc)

        async def run(valid: list[tuple[list[GenerationRequest], Answer]]) -> list[GenerationResult]:
            return await self.core.results([request for requests, _ in valid for request in requests])

        def answer(chat: tuple[list[GenerationRequest], Answer], result: GenerationResult) -> dict[str, Any]:
            answered = chat_error_row(result.error) if result.failed else chat[1].result(result)
            # content: the text where nothing was read apart; no calls: null, as a message without them
            return {"content": answered["text"], **answered, "tool_calls": answered.get("tool_calls") or None}

        return await answer_rows(built, run, answer, chat_error_row)

    async def generate_stream(
        self, prompt: str, *, priority: int = 0, tenant: str | None = None, **sampling: Any
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream one prompt's output (``handle.options(stream=True)``): deltas, then the result."""
        requests = await self._prompt(prompt, sampling, priority, tenant)
        async for item in self._stream(requests, Answer(requests[0])):
            yield item

    async def chat_stream(self, messages: list[dict[str, Any]], **fields: Any) -> AsyncIterator[dict[str, Any]]:
        """Stream a conversation's answer (``handle.options(stream=True)``): deltas, then the result."""
        async for item in self._stream(*await self._chat(messages, fields)):
            yield item

    async def _stream(self, requests: list[GenerationRequest], answer: Answer) -> AsyncIterator[dict[str, Any]]:
        async for _, output in self.core.run(requests):
            if isinstance(output, GenerationDelta):
                item = {"type": "delta", "text": output.text, "output_tokens": output.output_tokens}
                if output.logprobs is not None:  # asked for (``logprobs=``; ``chat_stream``: ``logprobs=True``)
                    item["logprobs"] = answer.logprobs(output.logprobs)
                if answer.token_ids:
                    item["token_ids"] = list(output.token_ids)
                yield item
            else:
                yield {"type": "result", **answer.result(succeeded(output))}
