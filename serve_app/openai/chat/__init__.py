"""``POST /v1/chat/completions``: its request and refusals (:mod:`.request`), its answers (:mod:`.format`)."""

from .format import ChatFormat, Reader, read_output, token_logprobs
from .request import ChatCompletionRequest, ChatMessage, ContentPart, message_refusals

__all__ = [
    "ChatCompletionRequest",
    "ChatFormat",
    "ChatMessage",
    "ContentPart",
    "Reader",
    "message_refusals",
    "read_output",
    "token_logprobs",
]
