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
    """Bad input, with a message that names the problem (HTTP 400; a ``ValueError`` through a handle);
    ``param`` names the offending field where there is one."""

    status = 400

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFoundError(RequestError):
    """The request names a model this server does not serve (HTTP 404, as vLLM answers)."""

    status = 404

    def __init__(self, message: str) -> None:
        super().__init__(message, param="model")


def parse(model: type[BaseModel], data: dict[str, Any]) -> Any:
    """Validate ``data`` as ``model``, raising :class:`RequestError` (a plain ``ValueError`` that Ray can
    carry through a handle, unlike pydantic's) whose message names each bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
        first = ".".join(str(p) for p in exc.errors()[0]["loc"]) if exc.errors() else None
        raise RequestError(f"invalid request: {problems}", param=first) from None


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


class RequestBuilder:
    """Validates and tokenizes requests against one engine and the app's limits."""

    def __init__(self, engine: Engine, config: AppConfig) -> None:
        self.engine = engine
        self.config = config

    def sampling(self, fields: SamplingFields | dict[str, Any] | None) -> SamplingOptions:
        """Merge per-request sampling with the app's defaults (then vLLM's) and check the limits."""
        if not isinstance(fields, SamplingFields):
            fields = parse(SamplingFields, fields or {})
        defaults = self.config.sampling
        max_tokens = fields.max_tokens if fields.max_tokens is not None else defaults.max_tokens
        if max_tokens > self.config.max_tokens_limit:
            raise RequestError(f"max_tokens={max_tokens} exceeds this server's limit of {self.config.max_tokens_limit}")
        stop = fields.stop if fields.stop is not None else defaults.stop
        given = fields.model_dump(
            exclude_none=True, exclude={"max_tokens", "temperature", "top_p", "stop", "seed", "logit_bias"}
        )
        given = {name: value for name, value in given.items() if name in SamplingOptions.__dataclass_fields__}
        if "stop_token_ids" in given:
            given["stop_token_ids"] = tuple(given["stop_token_ids"])
        return SamplingOptions(
            max_tokens=max_tokens,
            temperature=fields.temperature if fields.temperature is not None else defaults.temperature,
            top_p=fields.top_p if fields.top_p is not None else defaults.top_p,
            stop=tuple(stop or ()),
            seed=fields.seed if fields.seed is not None else defaults.seed,
            logit_bias=tuple((int(token), bias) for token, bias in (fields.logit_bias or {}).items()),
            **given,
        )

    def from_prompts(
        self, prompts: Sequence[str] | Sequence[Sequence[int]], sampling: SamplingOptions, n: int = 1
    ) -> list[GenerationRequest]:
        """``n`` engine requests per prompt (text, or token ids), in order."""
        if isinstance(prompts, str):
            raise RequestError("prompts must be a list of strings, not a single string")
        if not isinstance(prompts, (list, tuple)):
            raise RequestError(f"prompts must be a list of strings, got {type(prompts).__name__}")
        if not prompts:
            raise RequestError("no prompts provided")
        limit = self.config.max_prompts_per_request
        if len(prompts) > limit:
            raise RequestError(f"{len(prompts)} prompts in one request; at most {limit} are allowed")
        if len(prompts) * n > limit:
            raise RequestError(f"{len(prompts)} prompts x n={n} in one request; at most {limit} are allowed")
        requests = []
        for index, prompt in enumerate(prompts):
            what = f"prompts[{index}]"
            if _is_token_ids(prompt):
                if not prompt:
                    raise RequestError(f"{what} is empty")
                token_ids, text = list(prompt), ""
            elif isinstance(prompt, str):
                if not prompt.strip():
                    raise RequestError(f"{what} is empty")
                self._check_chars(prompt, what)
                token_ids, text = self.engine.encode(prompt), prompt
            else:
                raise RequestError(f"{what} must be a string or a list of token ids, got {type(prompt).__name__}")
            requests += [self._request(token_ids, text, sampling, what) for _ in range(n)]
        return requests

    def from_chat(
        self, messages: Sequence[dict[str, str]], sampling: SamplingOptions, n: int = 1
    ) -> list[GenerationRequest]:
        """``n`` engine requests for a conversation (``{"role", "content"}`` dicts, content as text), with
        the model's chat template applied."""
        if not messages:
            raise RequestError("messages must not be empty")
        for index, message in enumerate(messages):
            self._check_chars(message.get("content", ""), f"messages[{index}].content")
        token_ids, text = self.engine.encode_chat(messages)
        return [self._request(token_ids, text, sampling, "messages") for _ in range(n)]

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
