"""``POST /v1/chat/completions``: its request and refusals (:mod:`.request`), its answers (:mod:`.format`), and a
chat answer as the handle methods return it (:mod:`.answer`)."""

from .answer import Answer
from .format import ChatFormat, Reader, read_output, token_logprobs
from .request import ChatCompletionRequest, ChatMessage, ContentPart, TemplateFields, message_refusals

__all__ = [
    "Answer",
    "ChatCompletionRequest",
    "ChatFormat",
    "ChatMessage",
    "ContentPart",
    "Reader",
    "TemplateFields",
    "message_refusals",
    "read_output",
    "token_logprobs",
]
