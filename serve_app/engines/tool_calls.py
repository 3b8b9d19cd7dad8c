"""vLLM's tool parsers (``vllm serve --tool-call-parser``) as the vLLM engine uses them: a parser class by name, and
a reader of one request's output that gives its content and its calls."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def parser_class(name: str) -> Any:
    """vLLM's tool parser of this name; a ``ValueError`` listing vLLM's own names for one it does not have."""
    from vllm.tool_parsers import ToolParserManager

    try:
        return ToolParserManager.get_tool_parser(name)
    except KeyError:
        names = ", ".join(sorted(ToolParserManager.list_registered()))
        raise ValueError(f"vllm.tool_call_parser: {name!r} is not one of vLLM's tool parsers ({names})") from None


def reader(
    parser: Any, tokenizer: Any, tools: Sequence[dict[str, Any]]
) -> Callable[[str], tuple[str | None, list[tuple[str, str]]]]:
    """A reader of outputs to one request with ``tools`` (OpenAI's definitions): an output's content and its calls
    as ``(name, arguments)``, read by vLLM's ``parser`` (a class from :func:`parser_class`)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": ""}], "tools": list(tools), "tool_choice": "auto"}
    )
    instance = parser(tokenizer, request.tools)

    def read(text: str) -> tuple[str | None, list[tuple[str, str]]]:
        found = instance.extract_tool_calls(text, request)
        calls = [(call.function.name, call.function.arguments) for call in found.tool_calls]
        return (found.content, calls) if found.tools_called else (text, [])

    return read
