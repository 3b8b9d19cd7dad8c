"""``/v1/responses``: OpenAI's Responses API on the chat path (its request in :mod:`.request`, its response and
events in :mod:`.format`)."""

from .format import ResponsesFormat, answer_turn
from .request import ResponsesRequest, responses_error

__all__ = ["ResponsesFormat", "ResponsesRequest", "answer_turn", "responses_error"]
