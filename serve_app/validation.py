"""Request validation: turn prompts or chat messages plus sampling fields into engine requests, refusing
up front what the engine would fail on (empty input, too many prompts, a prompt past the context)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from .config import AppConfig
from .engines import Engine, GenerationRequest, SamplingOptions
from .schemas import SamplingFields, is_valid_unicode


class RequestError(ValueError):
    """Bad input, with a message that names the problem (HTTP 400; a ``ValueError`` through a handle)."""


def parse(model: type[BaseModel], data: dict[str, Any]) -> Any:
    """Validate ``data`` as ``model``, raising :class:`RequestError` (a plain ``ValueError`` that Ray can
    carry through a handle, unlike pydantic's) whose message names each bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
        raise RequestError(f"invalid request: {problems}") from None


class RequestBuilder:
    """Validates and tokenizes requests against one engine and the app's limits."""

    def __init__(self, engine: Engine, config: AppConfig) -> None:
        self.engine = engine
        self.config = config

    def sampling(self, fields: SamplingFields | dict[str, Any] | None) -> SamplingOptions:
        """Merge per-request sampling with the app's defaults and check the limits."""
        if not isinstance(fields, SamplingFields):
            fields = SamplingFields.model_validate(fields or {})
        defaults = self.config.sampling
        max_tokens = fields.max_tokens if fields.max_tokens is not None else defaults.max_tokens
        if max_tokens > self.config.max_tokens_limit:
            raise RequestError(f"max_tokens={max_tokens} exceeds this server's limit of {self.config.max_tokens_limit}")
        stop = fields.stop if fields.stop is not None else defaults.stop
        return SamplingOptions(
            max_tokens=max_tokens,
            temperature=fields.temperature if fields.temperature is not None else defaults.temperature,
            top_p=fields.top_p if fields.top_p is not None else defaults.top_p,
            stop=tuple(stop or ()),
            seed=fields.seed if fields.seed is not None else defaults.seed,
        )

    def from_prompts(self, prompts: Sequence[str], sampling: SamplingOptions) -> list[GenerationRequest]:
        """One engine request per prompt, in order."""
        if isinstance(prompts, str):
            raise RequestError("prompts must be a list of strings, not a single string")
        if not isinstance(prompts, (list, tuple)):
            raise RequestError(f"prompts must be a list of strings, got {type(prompts).__name__}")
        if not prompts:
            raise RequestError("no prompts provided")
        limit = self.config.max_prompts_per_request
        if len(prompts) > limit:
            raise RequestError(f"{len(prompts)} prompts in one request; at most {limit} are allowed")
        requests = []
        for index, prompt in enumerate(prompts):
            if not isinstance(prompt, str):
                raise RequestError(f"prompts[{index}] must be a string, got {type(prompt).__name__}")
            if not prompt.strip():
                raise RequestError(f"prompts[{index}] is empty")
            self._check_chars(prompt, f"prompts[{index}]")
            requests.append(self._request(self.engine.encode(prompt), prompt, sampling, f"prompts[{index}]"))
        return requests

    def from_chat(self, messages: Sequence[dict[str, str]], sampling: SamplingOptions) -> GenerationRequest:
        """One engine request for a conversation, with the model's chat template applied."""
        if not messages:
            raise RequestError("messages must not be empty")
        for index, message in enumerate(messages):
            self._check_chars(message.get("content", ""), f"messages[{index}].content")
        token_ids, text = self.engine.encode_chat(messages)
        return self._request(token_ids, text, sampling, "messages")

    def _check_chars(self, text: str, what: str) -> None:
        if len(text) > self.config.max_prompt_chars:
            raise RequestError(
                f"{what} has {len(text)} characters; at most {self.config.max_prompt_chars} are accepted"
            )
        if not is_valid_unicode(text):
            raise RequestError(f"{what} is not valid Unicode (it holds a lone surrogate such as '\\ud800')")

    def _request(self, token_ids: list[int], text: str, sampling: SamplingOptions, what: str) -> GenerationRequest:
        context = self.engine.max_model_len
        if len(token_ids) >= context:
            raise RequestError(f"{what} has {len(token_ids)} tokens; the model's context is {context} tokens")
        if len(token_ids) + sampling.max_tokens > context:
            raise RequestError(
                f"{what} has {len(token_ids)} tokens and asks for max_tokens={sampling.max_tokens}: "
                f"{len(token_ids) + sampling.max_tokens} exceeds the model's context of {context} tokens"
            )
        return GenerationRequest(f"req-{uuid.uuid4().hex}", token_ids, sampling, text)
