"""``POST /v1/embeddings`` in OpenAI's shape: the request body, its inputs checked and tokenized, and the
response (the ``openai`` package's models; ``encoding_format: base64`` as OpenAI sends it, little-endian
float32 bytes, which the OpenAI Python client asks for by default and decodes itself)."""

from __future__ import annotations

import base64
import struct
import uuid
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..engines.encoder import EmbeddingRequest, EncoderEngine
from ..schemas import Text, TokenId, is_valid_unicode
from ..validation import RequestError
from .config import EmbeddingConfig


class EmbeddingBody(BaseModel):
    """OpenAI's embeddings request, plus vLLM's ``truncate_prompt_tokens``. Unknown fields get a 422."""

    model_config = ConfigDict(extra="forbid")

    input: Text | list[Text] | list[TokenId] | list[list[TokenId]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, description="vLLM's extension: keep the first N tokens of a longer input (-1: the model's max)"
    )

    def inputs(self) -> list[str | list[int]]:
        """The inputs as a list: texts, or token-id lists."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [list(value)]  # one input given as token ids
        return list(value)


class EmbeddingInputs:
    """Checks inputs against the model and the config and tokenizes them, refusing up front what the
    encoder would fail on. Too long an input is refused with a 400, as OpenAI and vLLM do (the API has no
    truncation flag, and silently embedding a prefix would hide data loss), unless the request asks for
    truncation with ``truncate_prompt_tokens``."""

    def __init__(self, engine: EncoderEngine, config: EmbeddingConfig) -> None:
        self.engine = engine
        self.config = config

    def requests(self, inputs: Sequence[Any], truncate: int | None = None) -> list[EmbeddingRequest]:
        """One :class:`EmbeddingRequest` per input, or a :class:`RequestError` naming the first bad input."""
        if not inputs:
            raise RequestError("input: must not be empty", param="input")
        limit = self.config.max_inputs_per_request
        if len(inputs) > limit:
            raise RequestError(f"input: {len(inputs)} inputs, at most {limit} per request", param="input")
        texts = [(i, x) for i, x in enumerate(inputs) if isinstance(x, str)]
        for i, text in texts:
            self._check_text(i, text)
        tokenized = dict(zip((i for i, _ in texts), self.engine.tokenize([t for _, t in texts])))
        return [
            EmbeddingRequest(uuid.uuid4().hex, self._check_ids(i, tokenized.get(i, x), truncate))
            for i, x in enumerate(inputs)
        ]

    def one(self, index: int, value: Any, truncate: int | None = None) -> EmbeddingRequest:
        """A request for a single input (Ray Data rows: each row's problem stays its own)."""
        if not isinstance(value, str):
            raise RequestError(f"input[{index}]: expected a string, got {type(value).__name__}", param="input")
        self._check_text(index, value)
        (ids,) = self.engine.tokenize([value])
        return EmbeddingRequest(uuid.uuid4().hex, self._check_ids(index, ids, truncate))

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
            return self.engine.truncate(ids, most if truncate == -1 else min(truncate, most))
        if len(ids) > most:
            raise RequestError(
                f"input[{index}]: {len(ids)} tokens, but this model reads at most {most}; shorten it, or ask for "
                "truncation with truncate_prompt_tokens",
                param="input",
            )
        return ids


def encode_vector(vector: list[float], fmt: str) -> list[float] | str:
    """A vector as OpenAI sends it: floats, or base64 of little-endian float32 bytes."""
    if fmt == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def response(model: str, vectors: Sequence[list[float]], tokens: int, fmt: str) -> dict[str, Any]:
    """OpenAI's ``CreateEmbeddingResponse`` body."""
    from openai.types import CreateEmbeddingResponse, Embedding
    from openai.types.create_embedding_response import Usage

    body = CreateEmbeddingResponse(
        object="list",
        model=model,
        data=[Embedding(object="embedding", index=i, embedding=[]) for i in range(len(vectors))],
        usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
    ).model_dump(mode="json")
    for item, vector in zip(body["data"], vectors):
        item["embedding"] = encode_vector(vector, fmt)  # set after validation: base64 is a string
    return body
