"""The generation deployment: a thin Serve shell over the generation core (:class:`~serve_app.core.Generator`),
reached over HTTP (FastAPI) or through a ``DeploymentHandle``. Every route and handle method builds its requests
with the core's request builder and takes the core's one path, :meth:`~serve_app.core.Generator.run`.

Handle methods (``handle.<method>.remote(...)``):

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

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from typing import Any

from fastapi.responses import JSONResponse, PlainTextResponse, Response
from ray import serve

from ..config import AppConfig
from ..config.lora import adapter_folder
from ..core import Generator, parse
from ..core.base import check_batch
from ..core.generator import succeeded
from ..core.rows import answer_rows, chat_error_row
from ..engines import GenerationDelta, GenerationRequest, GenerationResult
from ..errors import RequestError
from ..openai.chat import Answer, ChatCompletionRequest, ChatFormat, Reader
from ..openai.common import KeyTenant, OpenAIRequest, Origin, SamplingFields, sse
from ..openai.completions import CompletionFormat, CompletionRequest
from ..openai.generate import GenerateRequest, GenerateResponse, PromptResult
from ..openai.responses import ResponsesFormat, ResponsesRequest, answer_turn, responses_error
from ..openai.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from ..openai.tools import ToolCalls
from . import adapters
from .http import event_stream
from .replica import Replica, make_api
from .response_store import response_store, stored

logger = logging.getLogger("serve_app")

MODELS_TIMEOUT_S = 5.0
"""How long ``/v1/models`` waits for the embedding app's model card."""

api = make_api("token-batching LLM server", "Token-aware admission and batching in front of vLLM, on Ray Serve.")


def origin(priority: Any, tenant: Any) -> Origin:
    """A handle call's ``priority`` and ``tenant``, checked (a ``ValueError`` naming a bad one)."""
    return parse(Origin, {"priority": priority, "tenant": tenant})


@serve.deployment(name="LLMServer")
@serve.ingress(api)
class LLMServer(Replica):
    """One replica: the generation core behind HTTP routes and handle methods."""

    core: Generator

    async def __init__(self, config: dict[str, Any] | AppConfig) -> None:
        self._runtime_adapters: dict[str, str] = {}
        await self.setup(api, AppConfig.model_validate(config), Generator)

    async def every_period(self) -> None:
        """Serve the adapters loaded at run time, wherever they were loaded (:mod:`.adapters`)."""
        if self.config.lora is None:
            return
        runtime = await adapters.registry(serve.get_replica_context().app_name).all.remote()
        if runtime != self._runtime_adapters:
            await self.core.set_runtime_adapters(runtime)
            self._runtime_adapters = runtime

    # -- DeploymentHandle API --------------------------------------------------------------------------------

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
        return requests, Answer(
            requests[0], bool(body.return_token_ids), self._tool_calls(body), reader, body.include_reasoning
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
                    item["logprobs"] = [asdict(token) for token in output.logprobs]
                if answer.token_ids:
                    item["token_ids"] = list(output.token_ids)
                yield item
            else:
                yield {"type": "result", **answer.result(succeeded(output))}

    # -- HTTP API --------------------------------------------------------------------------------------------

    @api.post("/generate", response_model=GenerateResponse)
    async def http_generate(self, body: GenerateRequest, key: KeyTenant) -> GenerateResponse:
        """The seeds' endpoint: texts in ``results``, in input order."""
        body.sent_with(key)
        requests = self.core.requests
        checked = await requests.prompts(body.prompts, requests.check(body), origin=body.origin)
        results = await self.core.complete(checked)
        return GenerateResponse(
            task_id=body.task_id,
            results=[r.text for r in results],
            details=[PromptResult.model_validate(r.to_dict()) for r in results],
        )

    @api.post("/v1/completions")
    async def http_completions(self, body: CompletionRequest, key: KeyTenant) -> Response:
        """OpenAI completions; ``"stream": true`` answers with Server-Sent Events."""
        body.sent_with(key)
        requests = await self.core.requests.completion(body)
        echo = [r.prompt_text for r in requests[:: body.n]] if body.echo else []
        ids = [r.prompt_token_ids for r in requests[:: body.n]] if body.return_token_ids else None
        model = requests[0].sampling.adapter or self.config.model_name
        fmt = CompletionFormat(model, body.n, echo, body.logprob_counts()[0], body.echo_only, ids)
        return await self._answer(body, requests, fmt)

    @api.post("/v1/chat/completions")
    async def http_chat_completions(self, body: ChatCompletionRequest, key: KeyTenant) -> Response:
        """OpenAI chat completions, with the model's chat template; ``"stream": true`` answers with SSE."""
        body.sent_with(key)
        requests = await self.core.requests.chat_completion(body)
        ids = requests[0].prompt_token_ids if body.return_token_ids else None
        return await self._answer(body, requests, self._chat_format(body, requests, ids))

    def _chat_format(
        self, body: ChatCompletionRequest, requests: list[GenerationRequest], ids: list[int] | None = None
    ) -> ChatFormat:
        calls, reader = self._tool_calls(body), self._reader(body, requests[0])
        top = body.logprob_counts()[0]
        model = requests[0].sampling.adapter or self.config.model_name  # an adapter answers under its own name
        return ChatFormat(model, body.n, top, ids, calls, reader, body.include_reasoning)

    @api.post("/v1/responses")
    async def http_responses(self, body: ResponsesRequest, key: KeyTenant) -> Response:
        """OpenAI's Responses API on the chat path; a stored response (``store``, the default) continues in a
        request naming it (``previous_response_id``), on any replica."""
        previous = body.previous_response_id
        history = (await stored(previous, "previous_response_id"))["conversation"] if previous else []
        try:
            chat = parse(ChatCompletionRequest, body.chat_body(history))
            chat.sent_with(key)
            requests = await self.core.requests.chat_completion(chat)
        except RequestError as exc:
            raise responses_error(exc) from None
        fmt = ResponsesFormat(body, self._chat_format(chat, requests))

        async def store(results: list[GenerationResult]) -> None:
            if body.store:
                final = fmt.response(results)
                turns = [*history, *body.messages(), answer_turn(final)]
                await response_store().put.remote(final.model_dump(mode="json", exclude_none=True), turns)

        return await self._answer(chat, requests, fmt, store)

    @api.get("/v1/responses/{response_id}")
    async def http_get_response(self, response_id: str) -> JSONResponse:
        """A stored response, as it was sent."""
        return JSONResponse((await stored(response_id))["response"])

    @api.delete("/v1/responses/{response_id}")
    async def http_delete_response(self, response_id: str) -> JSONResponse:
        """Delete a stored response (a 404 where there is none)."""
        await stored(response_id, delete=True)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})

    def _reads_own_calls(self, body: ChatCompletionRequest) -> bool:
        """Whether the request's calls are in the model's own format, read by the engine's tool parser: ``auto``'s,
        and forced ones where the parser forced them so."""
        how = body.tool_mode
        return how == "auto" or (how in ("required", "named") and self.core.engine.reads_forced_calls)

    def _tool_calls(self, body: ChatCompletionRequest) -> ToolCalls | None:
        """How the request's answers are read for tool calls (None: it uses no tools)."""
        own = self._reads_own_calls(body)
        parse = self.core.engine.tool_call_reader(body.tool_dicts() or []) if own else None
        return ToolCalls.of(body.tool_mode, body.tool_choice, parse)

    def _reader(self, body: ChatCompletionRequest, request: GenerationRequest) -> Reader | None:
        """New readers of the request's outputs for the model's thoughts and its own calls as they stream
        (:meth:`_reads_own_calls`), where the engine has the parsers."""
        engine, tools = self.core.engine, body.tool_dicts() if self._reads_own_calls(body) else None
        parsers = engine.parsers
        if parsers is None or not (parsers.reads_reasoning or (tools and parsers.reads_tool_calls)):
            return None
        return lambda: engine.output_reader(request.prompt_token_ids, tools)

    @api.post("/v1/load_lora_adapter")
    async def http_load_adapter(self, body: adapters.LoadAdapterRequest) -> PlainTextResponse:
        """vLLM's runtime adapter loading, for every replica of the app (the ``lora`` setting must be there)."""
        answer = await adapters.load(serve.get_replica_context().app_name, self.config, body)
        await self.every_period()
        return PlainTextResponse(answer)

    @api.post("/v1/unload_lora_adapter")
    async def http_unload_adapter(self, body: adapters.UnloadAdapterRequest) -> PlainTextResponse:
        """vLLM's runtime adapter unloading: an adapter loaded at run time, from every replica of the app."""
        answer = await adapters.unload(serve.get_replica_context().app_name, self.config, body)
        await self.every_period()
        return PlainTextResponse(answer)

    @api.post("/tokenize", response_model=TokenizeResponse)
    async def http_tokenize(self, body: TokenizeRequest) -> TokenizeResponse:
        """vLLM's ``/tokenize``: the token ids a prompt or chat messages run as, and the model's context."""
        tokens = await self.core.requests.tokenize(body)
        return TokenizeResponse(count=len(tokens), max_model_len=self.core.engine.max_model_len, tokens=tokens)

    @api.post("/detokenize", response_model=DetokenizeResponse)
    async def http_detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        """vLLM's ``/detokenize``: token ids back to text."""
        return DetokenizeResponse(prompt=await self.core.requests.detokenize(body))

    async def _answer(
        self,
        body: OpenAIRequest,
        requests: list[GenerationRequest],
        fmt: CompletionFormat | ChatFormat | ResponsesFormat,
        finish: Callable[[list[GenerationResult]], Awaitable[None]] | None = None,
    ) -> Response:
        """One JSON body, or (``stream``) Server-Sent Events: each choice's chunks as they come, and an error event
        (never a finish reason) if a prompt fails. ``finish``: awaited once every result is in, before the client
        sees the end (the Responses API stores its response there)."""
        if not body.stream:
            results = await self.core.complete(requests)
            payload = fmt.response(results).model_dump(mode="json", exclude_none=True)
            if finish is not None:
                await finish(results)
            return JSONResponse(payload)
        outputs = self.core.run(requests)  # a full queue is refused here, with a status, before the stream starts
        results: list[Any] = [None] * len(requests)

        async def events() -> AsyncIterator[str]:
            async for index, output in outputs:
                if isinstance(output, GenerationResult):
                    results[index] = succeeded(output, index)
                    chunks = fmt.final_chunks(index, output)
                    if finish is not None and all(result is not None for result in results):
                        await finish(results)
                else:
                    chunks = fmt.chunks(index, output)
                for chunk in chunks:
                    yield sse(chunk, getattr(chunk, "type", None))  # Responses events are named

        return event_stream(events(), lambda: fmt.usage_chunk(results) if body.include_usage else None)

    def adapter_cards(self, base: dict[str, Any]) -> list[dict[str, Any]]:
        """Each LoRA adapter as vLLM's ``/v1/models`` lists it: its folder as ``root``, the base model as ``parent``."""
        return [
            {**base, "id": name, "root": adapter_folder(folder, prepare=False), "parent": base["id"]}
            for name, folder in self.core.requests.adapters.items()
        ]

    async def model_cards(self) -> list[dict[str, Any]]:
        """This app's model, and the embedding app's when one is configured beside it (``embeddings_app``) and
        answers within a few seconds (``/v1/models`` must not fail because of it)."""
        base = await self.model_card()
        cards = [base, *self.adapter_cards(base)]
        name = self.config.embeddings_app
        if name is not None:
            try:
                cards.append(await asyncio.wait_for(serve.get_app_handle(name).model_card.remote(), MODELS_TIMEOUT_S))
            except Exception as exc:
                logger.warning("the embedding app %r did not give its model: %r", name, exc)
        return cards
