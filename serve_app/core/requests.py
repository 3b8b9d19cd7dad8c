"""Request building for the generation core: every check a generation request gets, in one place. The body's own
refusals (fields this server cannot honour) and model, the app's limits, each prompt's text, and its tokens against
the model's context (:mod:`.context`: cut and fitted as vLLM's server does); then tokenized (off the event loop, by
the engine's own tokenizer) into engine requests.

A batch of prompts is checked row by row (:meth:`RequestBuilder.rows`: one bad prompt is that row's problem alone,
as Ray Data jobs need) or all or none (:meth:`RequestBuilder.prompts`: the first problem refuses the request, as an
HTTP request is answered)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ValidationError

from ..config import AppConfig
from ..engines import Engine, GenerationRequest, SamplingOptions, StructuredOutputs
from ..errors import ModelNotFoundError, RequestError, validation_error
from ..openai import tools
from ..openai.chat import ChatCompletionRequest
from ..openai.common import Origin, SamplingFields
from ..openai.completions import CompletionRequest
from ..openai.tokenize import DetokenizeRequest, TokenizeRequest
from ..openai.types import is_valid_unicode
from .base import check_batch
from .context import fitted, truncated

_NOT_SAMPLING = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "logit_bias",
    "logprobs",
    "prompt_logprobs",
    "structured_outputs",
}
INTERACTIVE = Origin()
"""Priority 0, no tenant: what an HTTP or handle request is unless it says otherwise."""


def parse(model: type[BaseModel], data: Any) -> Any:
    """Validate ``data`` as ``model``, raising :class:`RequestError` (a ``ValueError`` Ray carries through a
    handle, unlike pydantic's) that names each bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


class RequestBuilder:
    """Checks and tokenizes requests against one engine and the app's limits."""

    def __init__(self, engine: Engine, config: AppConfig) -> None:
        self.engine = engine
        self.config = config
        self.adapters: dict[str, str] = dict(config.lora.adapters) if config.lora is not None else {}
        """The LoRA adapters a request may name (name -> folder): the setting's, and those loaded at run time."""

    def check(self, body: SamplingFields, model: str | None = None) -> SamplingOptions:
        """Refuse what ``body`` asks for that cannot be honoured, and a model this server does not serve; return
        its sampling merged with the app's defaults."""
        self.refuse(body, model)
        return self.sampling(body)

    def adapter(self, model: str | None) -> str | None:
        """The LoRA adapter ``model`` names (None: the base model); raises for a model this server does not
        serve, naming those it does."""
        if model is None or model in (self.config.model_name, self.config.model):
            return None
        if model in self.adapters:
            return model
        served = ", ".join(f"`{name}`" for name in [self.config.model_name, *self.adapters])
        raise ModelNotFoundError(f"The model `{model}` does not exist; this server serves {served}")

    def refuse(self, body: Any, model: str | None) -> None:
        """Raise for a model this server does not serve, then for the body's first refusal (``refusals()``)."""
        self.adapter(model)
        for field, why in body.refusals():
            raise RequestError(f"{field}: {why}", param=field)

    async def tokenize(self, body: TokenizeRequest) -> list[int]:
        """The token ids a ``/tokenize`` body's prompt or messages would run as, tokenized as the generation
        routes tokenize them."""
        self.refuse(body, body.model)
        if body.prompt is not None:
            self._check_text(body.prompt, "prompt")
            (ids,) = await self.engine.encode([body.prompt], body.add_special_tokens is not False)
            return ids
        messages = [m.template_input() for m in body.messages or ()]
        ids, _ = await self._encode_chat(messages, tools.shown(body.tools), body.template_kwargs())
        return ids  # not checked against the model's context: a client counts to learn whether it fits

    async def detokenize(self, body: DetokenizeRequest) -> str:
        """The text of a ``/detokenize`` body's token ids (each checked against the model's vocabulary)."""
        self.refuse(body, body.model)
        self.engine.check_token_ids(body.tokens, "tokens")
        return await self.engine.decode(body.tokens)

    def sampling(self, fields: SamplingFields) -> SamplingOptions:
        """Merge per-request sampling with the app's defaults (then vLLM's) and check the limits."""
        defaults = self.config.sampling
        max_tokens = fields.max_tokens if fields.max_tokens is not None else defaults.max_tokens
        if max_tokens > self.config.max_tokens_limit:
            raise RequestError(
                f"max_tokens={max_tokens} exceeds this server's limit of {self.config.max_tokens_limit}",
                param="max_tokens",
            )
        stop = fields.stop if fields.stop is not None else defaults.stop
        given = fields.model_dump(exclude_none=True, exclude=_NOT_SAMPLING)
        given = {name: value for name, value in given.items() if name in SamplingOptions.__dataclass_fields__}
        for name in ("stop_token_ids", "allowed_token_ids", "bad_words"):
            if name in given:
                given[name] = tuple(given[name])
        if (repeats := fields.repetition_detection) is not None:
            given["repetition_detection"] = (repeats.max_pattern_size, repeats.min_pattern_size, repeats.min_count)
        logprobs, prompt_logprobs = fields.logprob_counts()
        options = SamplingOptions(
            # 0 (completions' echo alone) runs as vLLM's server runs it: one token generated, the prompt returned
            max_tokens=max_tokens or 1,
            temperature=fields.temperature if fields.temperature is not None else defaults.temperature,
            top_p=fields.top_p if fields.top_p is not None else defaults.top_p,
            stop=tuple(stop or ()),
            seed=fields.seed if fields.seed is not None else defaults.seed,
            logit_bias=tuple((int(token), bias) for token, bias in (fields.logit_bias or {}).items()),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            structured_outputs=fields.output_constraint(),
            adapter=self.adapter(fields.model),
            **given,
        )
        self._check_engine(options, fields.constraint_field())
        return options

    def _check_engine(self, options: SamplingOptions, constraint_field: str) -> None:
        """The engine's own checks of ``options``; a refusal of the output constraint names the body's field that
        set it (``constraint_field``), as the body names it."""
        try:
            self.engine.check_sampling(options)
        except RequestError as exc:
            if exc.param != "structured_outputs" or constraint_field == exc.param:
                raise
            raise RequestError(str(exc).replace(exc.param, constraint_field, 1), param=constraint_field) from None

    # -- Prompts ------------------------------------------------------------------------------------------

    def _check_list(self, prompts: Any, n: int) -> None:
        limit = self.config.max_prompts_per_request
        check_batch(prompts, "prompts", "prompts", limit)
        if len(prompts) * n > limit:
            raise RequestError(
                f"{len(prompts)} prompts x n={n} in one request; at most {limit} are allowed", param="prompts"
            )

    def _check_text(self, text: str, what: str) -> None:
        if len(text) > self.config.max_prompt_chars:
            raise RequestError(
                f"{what} has {len(text)} characters; at most {self.config.max_prompt_chars} are accepted"
            )
        if not is_valid_unicode(text):
            raise RequestError(f"{what} is not valid Unicode (it holds a lone surrogate such as '\\ud800')")

    def _check_prompt(self, prompt: Any, what: str) -> None:
        if _is_token_ids(prompt):
            if not prompt:
                raise RequestError(f"{what} is empty")
            self.engine.check_token_ids(prompt, what)
        elif isinstance(prompt, str):
            if not prompt.strip():
                raise RequestError(f"{what} is empty")
            self._check_text(prompt, what)
        else:
            raise RequestError(f"{what} must be a string or a list of token ids, got {type(prompt).__name__}")

    async def rows(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        sampling: SamplingOptions,
        n: int = 1,
        origin: Origin = INTERACTIVE,
        add_special_tokens: bool = True,
    ) -> list[GenerationRequest | RequestError]:
        """``n`` engine requests per prompt (text, with the tokenizer's special tokens unless told not to; or token
        ids), in order, or the prompt's own problem in its place (a problem with the list itself, such as too many
        prompts, is raised)."""
        self._check_list(prompts, n)
        rows: list[GenerationRequest | RequestError] = []
        problems: dict[int, RequestError] = {}
        for index, prompt in enumerate(prompts):
            try:
                self._check_prompt(prompt, f"prompts[{index}]")
            except RequestError as exc:
                problems[index] = exc
        texts = {i: p for i, p in enumerate(prompts) if i not in problems and isinstance(p, str)}
        encoded = await self.engine.encode(list(texts.values()), add_special_tokens) if texts else []
        tokens = dict(zip(texts, encoded))
        for index, prompt in enumerate(prompts):
            if index in problems:
                rows += [problems[index]] * n
                continue
            token_ids, text = (tokens[index], prompt) if index in tokens else (list(prompt), "")
            try:
                rows += [self._request(token_ids, text, sampling, f"prompts[{index}]", origin) for _ in range(n)]
            except RequestError as exc:
                rows += [exc] * n
        return rows

    async def prompts(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        sampling: SamplingOptions,
        n: int = 1,
        origin: Origin = INTERACTIVE,
        add_special_tokens: bool = True,
    ) -> list[GenerationRequest]:
        """Like :meth:`rows`, all or none: the first prompt's problem refuses the request."""
        rows = await self.rows(prompts, sampling, n, origin, add_special_tokens)
        for row in rows:
            if isinstance(row, RequestError):
                raise row
        return rows  # type: ignore[return-value]

    async def chat(
        self,
        messages: Sequence[dict[str, Any]],
        sampling: SamplingOptions,
        n: int = 1,
        origin: Origin = INTERACTIVE,
        tools: Sequence[dict[str, Any]] | None = None,
        template: Mapping[str, Any] | None = None,
    ) -> list[GenerationRequest]:
        """``n`` engine requests for a conversation (``{"role", "content"}`` dicts, content as text), with the
        model's chat template applied (showing the model ``tools``, where given; ``template``: the call's arguments,
        :meth:`~serve_app.engines.Engine.encode_chat`'s): the prompt counts them too."""
        if not messages:
            raise RequestError("messages must not be empty", param="messages")
        token_ids, text = await self._encode_chat(messages, tools, template)
        return [self._request(token_ids, text, sampling, "messages", origin) for _ in range(n)]

    async def _encode_chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        template: Mapping[str, Any] | None = None,
    ) -> tuple[list[int], str]:
        """Each message's text checked, then the conversation through the model's chat template."""
        for index, message in enumerate(messages):
            self._check_text(message.get("content", ""), f"messages[{index}].content")
        return await self.engine.encode_chat(messages, tools, template)

    # -- OpenAI bodies ------------------------------------------------------------------------------------

    async def completion(self, body: CompletionRequest) -> list[GenerationRequest]:
        """A completions body's requests, ``n`` per prompt; with ``echo``, each carries its prompt's text."""
        sampling = self.check(body, body.model)
        requests = await self.prompts(body.prompts(), sampling, body.n, body.origin, body.add_special_tokens)
        if body.echo:
            for request in requests:
                request.prompt_text = request.prompt_text or await self.engine.decode(request.prompt_token_ids)
        return requests

    async def chat_completion(self, body: ChatCompletionRequest) -> list[GenerationRequest]:
        """A chat completions body's ``n`` requests; a forced tool call (``tool_choice`` ``required`` or a named
        function) is structured output, as vLLM's server makes it, and ``auto`` needs the engine's parser."""
        sampling = self.check(body, body.model)
        how = body.tool_mode
        if how == "auto" and not self.engine.reads_tool_calls:
            why = "tool_choice 'auto' (the default with tools) needs the app's vllm.tool_call_parser setting"
            raise RequestError(f"{why}; 'none', 'required' or a named function do not", param="tool_choice")
        constraint = self._tool_constraint(body, sampling)
        if constraint is not None:
            sampling = replace(sampling, structured_outputs=constraint)
            self._check_engine(sampling, "tools")  # the constraint is the tools' parameters: a refusal names them
        conversation, template = body.conversation(), body.template_kwargs()
        requests = await self.chat(conversation, sampling, body.n, body.origin, body.tool_dicts(), template)
        if not body.include_reasoning:  # vLLM's: no thoughts wanted, so the constraint holds from the first token
            for request in requests:
                request.reasoning_ended = True
        return requests

    def _tool_constraint(self, body: ChatCompletionRequest, sampling: SamplingOptions) -> StructuredOutputs | None:
        """What a request's tools make its output match, as vLLM's server does: with a tool parser, the constraint
        it gives (a forced call in the model's own format or as vLLM's JSON list of calls, strict tools' calls in
        ``auto`` where the request asks for no other structure; or none), without one vLLM's JSON list of calls for
        a forced call; None: free text."""
        how, engine = body.tool_mode, self.engine
        if how == "none" or not engine.structures_outputs:
            if how in ("required", "named"):
                why = f"tool_choice {how!r} is structured output, which the {engine.name} engine cannot do"
                raise RequestError(why, param="tool_choice")
            return None
        if how == "auto" and sampling.structured_outputs is not None:
            return None
        if engine.reads_tool_calls:  # the tool parser's own (None: vLLM's server leaves the output free too)
            choice = body.tool_choice.model_dump() if isinstance(body.tool_choice, tools.NamedToolChoice) else how
            return engine.tool_constraint(body.tool_dicts() or [], choice, body.parallel_tool_calls)
        schema = tools.output_schema(body.tools or [], body.tool_choice, body.parallel_tool_calls)
        return StructuredOutputs(json=json.dumps(schema))

    def _request(
        self, token_ids: list[int], text: str, sampling: SamplingOptions, what: str, origin: Origin
    ) -> GenerationRequest:
        context = self.engine.max_model_len
        cut = truncated(token_ids, sampling, context, self.engine.truncation_side, what)
        token_ids, text = cut, text if len(cut) == len(token_ids) else ""  # an echo shows what ran
        sampling = fitted(token_ids, sampling, context, what)
        request_id = f"req-{uuid.uuid4().hex}"
        return GenerationRequest(request_id, token_ids, sampling, text, origin.priority, origin.tenant)
