"""``POST /v1/embeddings``: OpenAI's request (plus vLLM's ``truncate_prompt_tokens``), what of it is refused, and
the response (the ``openai`` package's models; ``encoding_format: base64`` as OpenAI sends it, little-endian
float32 bytes, which the OpenAI Python client asks for by default and decodes itself)."""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field

from .fields import OpenAIModel
from .types import Refusal, Text, TokenId


class EmbeddingRequestBody(OpenAIModel):
    """OpenAI's embeddings request, plus vLLM's ``truncate_prompt_tokens`` (and ``request_id``, accepted)."""

    VLLM_EXTENSIONS: ClassVar[Mapping[str, Any]] = {
        "add_special_tokens": True,
        "cache_salt": None,
        "embed_dtype": "float32",
        "endianness": "native",
        "mm_processor_kwargs": None,
        "padding": None,
        "priority": 0,
        "truncation_side": None,
        "use_activation": None,
    }

    input: Text | list[Text] | list[TokenId] | list[list[TokenId]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, description="vLLM's extension: keep the first N tokens of a longer input (-1: the model's max)"
    )
    request_id: Text | None = None

    def inputs(self) -> list[str | list[int]]:
        """The inputs as a list: texts, or token-id lists."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [list(value)]  # one input given as token ids
        return list(value)  # type: ignore[arg-type]

    def refusals(self, dimensions: int) -> list[Refusal]:
        """What cannot be honoured by a model whose vectors have ``dimensions`` dimensions."""
        out = self.extension_refusals()
        if self.dimensions is not None and self.dimensions != dimensions:
            why = f"this model gives {dimensions}-dimensional vectors and cannot shorten them (not a Matryoshka model)"
            out.append(("dimensions", why))
        return out


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
