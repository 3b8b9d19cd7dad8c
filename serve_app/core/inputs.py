"""Input building for the embedding core: every check an embedding request gets, in one place (the model it
names, what the body asks that cannot be honoured, the app's limits, each input's text and its tokens against what
the model reads), then tokenized off the event loop. Too long an input is refused, as OpenAI and vLLM refuse it
(the API has no truncation flag, and silently embedding a prefix would hide data loss), unless the request asks
for truncation with ``truncate_prompt_tokens``.

As for generation, a batch of inputs is checked row by row (:meth:`InputBuilder.rows`) or all or none
(:meth:`InputBuilder.requests`)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from ..config import EmbeddingConfig
from ..engines.embedding import EmbeddingEngine, EmbeddingRequest
from ..errors import ModelNotFoundError, RequestError
from ..openai.embeddings import EmbeddingRequestBody
from ..openai.types import is_valid_unicode
from .base import check_batch


class InputBuilder:
    """Checks and tokenizes embedding inputs against one embedding engine and the app's limits."""

    def __init__(self, engine: EmbeddingEngine, config: EmbeddingConfig) -> None:
        self.engine = engine
        self.config = config

    def check(self, body: EmbeddingRequestBody) -> None:
        """Refuse a model this server does not serve and what the body asks that cannot be honoured."""
        if body.model is not None and body.model not in (self.config.model_name, self.config.model):
            served = self.config.model_name
            raise ModelNotFoundError(f"The model `{body.model}` does not exist; this server embeds with `{served}`")
        for field, why in body.refusals(self.engine.dimensions):
            raise RequestError(f"{field}: {why}", param=field)

    async def rows(self, inputs: Sequence[Any], truncate: int | None = None) -> list[EmbeddingRequest | RequestError]:
        """One request per input (text or token ids), in order, or the input's own problem in its place (a
        problem with the list itself, such as too many inputs, is raised)."""
        check_batch(inputs, "input", "inputs", self.config.max_inputs_per_request)
        most = self.engine.max_length
        if truncate is not None and truncate > most:  # vLLM's server refuses it too
            why = f"truncate_prompt_tokens={truncate} cannot be greater than the {most} tokens the model reads"
            raise RequestError(why, param="truncate_prompt_tokens")
        rows: list[Any] = list(inputs)
        texts: dict[int, str] = {}
        for index, value in enumerate(inputs):
            try:
                if isinstance(value, str):
                    self._check_text(index, value)
                    texts[index] = value
                elif not isinstance(value, list):
                    raise RequestError(f"input[{index}]: expected a string, got {type(value).__name__}", param="input")
            except RequestError as exc:
                rows[index] = exc
        for index, ids in zip(texts, await self.engine.tokenize(list(texts.values())) if texts else []):
            rows[index] = ids
        for index, row in enumerate(rows):
            if not isinstance(row, RequestError):
                try:
                    rows[index] = EmbeddingRequest(uuid.uuid4().hex, self._check_ids(index, row, truncate))
                except RequestError as exc:
                    rows[index] = exc
        return rows

    async def requests(self, inputs: Sequence[Any], truncate: int | None = None) -> list[EmbeddingRequest]:
        """Like :meth:`rows`, all or none: the first input's problem refuses the request."""
        rows = await self.rows(inputs, truncate)
        for row in rows:
            if isinstance(row, RequestError):
                raise row
        return rows  # type: ignore[return-value]

    def _check_text(self, index: int, text: str) -> None:
        if not text:
            raise RequestError(f"input[{index}]: must not be an empty string", param="input")
        if len(text) > self.config.max_input_chars:
            raise RequestError(
                f"input[{index}]: {len(text)} characters, at most {self.config.max_input_chars}", param="input"
            )
        if not is_valid_unicode(text):
            raise RequestError(f"input[{index}]: not valid Unicode (a lone surrogate)", param="input")

    def _check_ids(self, index: int, ids: Any, truncate: int | None) -> list[int]:
        if not isinstance(ids, list) or not ids:
            raise RequestError(f"input[{index}]: must not be empty", param="input")
        vocab = self.engine.vocab_size
        if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in ids):
            raise RequestError(f"input[{index}]: token ids must be integers in [0, {vocab})", param="input")
        most = self.engine.max_length
        if truncate is not None:
            return self.engine.truncate(ids, most if truncate == -1 else truncate)
        if len(ids) > most:
            raise RequestError(
                f"input[{index}]: {len(ids)} tokens, but this model reads at most {most}; shorten it, or ask for "
                "truncation with truncate_prompt_tokens",
                param="input",
            )
        return ids
