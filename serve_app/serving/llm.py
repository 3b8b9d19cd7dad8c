"""The generation deployment: a thin Serve shell over the generation core (:class:`~serve_app.core.Generator`),
reached over HTTP (FastAPI) or through a ``DeploymentHandle``. Every route and handle method builds its requests
with the core's request builder and takes the core's one path, :meth:`~serve_app.core.Generator.run`.

Its handle methods: :mod:`.handles`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.responses import JSONResponse, PlainTextResponse, Response
from ray import serve

from ..config import AppConfig
from ..config.lora import adapter_folder
from ..core import Generator, parse
from ..core.events import sse_events
from ..engines import GenerationRequest, GenerationResult
from ..errors import RequestError
from ..openai.chat import ChatCompletionRequest, ChatFormat, Reader
from ..openai.common import KeyTenant, OpenAIRequest
from ..openai.completions import CompletionFormat, CompletionRequest
from ..openai.generate import GenerateRequest, GenerateResponse, PromptResult
from ..openai.responses import ResponsesFormat, ResponsesRequest, answer_turn, responses_error
from ..openai.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from ..openai.tools import ToolCalls
from . import adapters
from .handles import HandleMethods
from .http import event_stream
from .replica import Replica, make_api
from .response_store import response_store, stored
from .routing.adapters import ADAPTER_SLOTS, ADAPTERS
from .routing.prefixes import PREFIX_CACHE_TOKENS
from .routing.sessions import response_id

logger = logging.getLogger("serve_app")

MODELS_TIMEOUT_S = 5.0
"""How long ``/v1/models`` waits for the embedding app's model card."""

api = make_api("token-batching LLM server", "Token-aware admission and batching in front of vLLM, on Ray Serve.")


@serve.deployment(name="LLMServer")
@serve.ingress(api)
class LLMServer(HandleMethods, Replica):
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

    async def record_routing_stats(self) -> dict[str, Any]:
        """The replica's report, with the LoRA adapters its engine holds (the token router's adapter score) and how
        many tokens its prefix cache holds (the prefix score's index keeps no more for it)."""
        engine = self.core.engine
        held = await engine.loaded_adapters()
        cache = engine.kv_cache_tokens() if engine.prefix_block_size() else 0  # None: unknown, no bound
        return {
            **await super().record_routing_stats(),
            ADAPTERS: held,
            ADAPTER_SLOTS: engine.adapter_slots,
            PREFIX_CACHE_TOKENS: cache,
        }

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
        by_id = bool(body.return_tokens_as_token_ids)
        fmt = CompletionFormat(model, body.n, echo, body.logprob_counts()[0], body.echo_only, ids, by_id)
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
        by_id = bool(body.return_tokens_as_token_ids)
        return ChatFormat(model, body.n, top, ids, calls, reader, body.include_reasoning, by_id)

    @api.post("/v1/responses")
    async def http_responses(self, body: ResponsesRequest, key: KeyTenant) -> Response:
        """OpenAI's Responses API on the chat path; a stored response (``store``, the default) continues in a
        request naming it (``previous_response_id``), on any replica. Its id names this replica, which the token
        router sends that request back to (:func:`.routing.sessions.response_id`)."""
        previous = body.previous_response_id
        history = (await stored(previous, "previous_response_id"))["conversation"] if previous else []
        try:
            chat = parse(ChatCompletionRequest, body.chat_body(history))
            chat.sent_with(key)
            requests = await self.core.requests.chat_completion(chat)
        except RequestError as exc:
            raise responses_error(exc) from None
        made_here = response_id(serve.get_replica_context().replica_id.unique_id)
        fmt = ResponsesFormat(body, self._chat_format(chat, requests), made_here)

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
            payload = fmt.response(results).model_dump_json(exclude_none=True)  # one pass in pydantic's core
            if finish is not None:
                await finish(results)
            return Response(payload, media_type="application/json")
        outputs = self.core.run(requests)  # a full queue is refused here, with a status, before the stream starts
        results: list[Any] = [None] * len(requests)
        events = sse_events(outputs, requests, fmt, results, body.continuous_usage, finish)
        return event_stream(events, lambda: fmt.usage_chunk(results) if body.include_usage else None)

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
