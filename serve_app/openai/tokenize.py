"""``POST /tokenize`` and ``POST /detokenize``: vLLM's server's token utilities. A prompt, or chat messages with the
model's chat template, to the token ids the engine would run (their count against the model's context), and token
ids back to text; what of them this server refuses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, Field, model_validator

from .chat import ChatMessage, TemplateFields, message_refusals
from .fields import OpenAIModel
from .tools import ChatTool
from .types import Refusal, Text, TokenId


class TokenizeRequest(TemplateFields, OpenAIModel):
    """vLLM's ``/tokenize`` body: a ``prompt`` (completions' tokenizing, special tokens added) or ``messages``
    (chat's: the template called as the chat route calls it, no special tokens added)."""

    VLLM_EXTENSIONS: ClassVar[Mapping[str, Any]] = {
        "chat_template": None,
        "media_io_kwargs": None,
        "mm_processor_kwargs": None,
    }

    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    tools: list[ChatTool] | None = Field(None, description="shown to the model with messages, as chat shows them")
    add_special_tokens: bool | None = None
    return_token_strs: bool | None = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self

    def refusals(self) -> list[Refusal]:
        """What differs from how the generation routes tokenize (the only way this server tokenizes)."""
        out = self.extension_refusals()
        chat = self.messages is not None
        if chat and self.add_special_tokens:
            why = "special tokens are not added to chat messages, as the chat route does not add them"
            out.append(("add_special_tokens", why))
        if chat:
            out += self.template_refusals()
        if self.return_token_strs:
            out.append(("return_token_strs", "token strings are not supported; /detokenize gives the text"))
        return out + message_refusals(self.messages or ())


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(OpenAIModel):
    """vLLM's ``/detokenize`` body: token ids (each within the model's vocabulary)."""

    model: Text | None = None
    tokens: list[TokenId] = Field(..., min_length=1)

    def refusals(self) -> list[Refusal]:
        """None: ids outside the vocabulary are the engine's to refuse."""
        return []


class DetokenizeResponse(BaseModel):
    prompt: str
