"""vLLM's output parsers as `vllm serve` uses them (``--tool-call-parser``, ``--reasoning-parser``): the model's
own tool calls in an output, and a reasoning model's thoughts apart from its answer. Engine-neutral: any engine
with the model's tokenizer holds one :class:`OutputParsers`."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

ToolReader = Callable[[str], tuple[str | None, list[tuple[str, str]]]]
"""An output's content and its calls as ``(name, arguments)``."""


def _request(**fields: Any) -> Any:
    """vLLM's chat request that its parsers read their settings from (the tools, ``include_reasoning``)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": ""}], **fields})


class OutputReader:
    """One output read as `vllm serve` reads it, whole or delta by delta: a reasoning model's thoughts apart from its
    answer, and, where the request gave tools with ``tool_choice: auto``, the model's own calls as they come
    (:attr:`reads_calls`). vLLM's composed parser keeps state between deltas: one reader per output."""

    def __init__(
        self, parser: Any, prompt_token_ids: Sequence[int], request: Any, reads_calls: bool, reads_reasoning: bool
    ) -> None:
        self._parser, self._prompt, self._request = parser, list(prompt_token_ids), request
        self.reads_calls, self.reads_reasoning = reads_calls, reads_reasoning
        parser.set_prompt_token_ids(self._prompt)

    def reasoning_tokens(self, token_ids: Sequence[int]) -> int | None:
        """How many of a whole output's tokens are thoughts (vLLM's count, for usage); None where no reasoning
        parser reads the output."""
        return self._parser.count_reasoning_tokens(list(token_ids)) if self.reads_reasoning else None

    def split(self, text: str, token_ids: Sequence[int]) -> tuple[str | None, str | None]:
        """A whole output's reasoning and content (either None where it has none; calls are read from the content
        apart, :meth:`OutputParsers.tool_reader`)."""
        reasoning, content, _ = self._parser.parse(text, self._request, model_output_token_ids=token_ids)
        return reasoning, content

    def delta(
        self, text: str, token_ids: Sequence[int], finished: bool = False
    ) -> tuple[str | None, str | None, list[dict[str, Any]]]:
        """The reasoning, content and pieces of tool calls (OpenAI's delta shape: ``index``, the first piece with
        ``id`` and the function's name, then pieces of its arguments) a stream's next delta adds. The parser may
        hold text back until it knows which it is; ``finished``: the output's end, where it gives back what it
        held."""
        found = self._parser.parse_delta(text, list(token_ids), self._request, self._prompt, finished=finished)
        if found is None:
            return None, None, []
        calls = [call.model_dump(exclude_none=True) for call in found.tool_calls]
        return found.reasoning or None, found.content or None, calls


class OutputParsers:
    """The parsers an app's settings name (``tool_call_parser``, ``reasoning_parser``: vLLM's names;
    ``tool_strict_level``: `vllm serve --tool-strict-level`), read over the model's tokenizer once it has one
    (:meth:`over`). A ``ValueError`` naming the setting for a name vLLM does not have, or a tokenizer the parser
    cannot read, as `vllm serve` fails at start-up."""

    def __init__(
        self, tool_call_parser: str | None, reasoning_parser: str | None, tool_strict_level: str = "auto"
    ) -> None:
        from vllm.parser import ParserManager

        self._tools = _tool_parser(tool_call_parser) if tool_call_parser else None
        if reasoning_parser:
            _check_reasoning_parser(reasoning_parser)
        self._names = {"tool_call_parser": tool_call_parser, "reasoning_parser": reasoning_parser}
        # vLLM's composed parsers: the thoughts alone, and (a tool parser named) the thoughts and the calls
        self._reasoning = ParserManager.get_parser(reasoning_parser_name=reasoning_parser) if reasoning_parser else None
        self._both = (
            ParserManager.get_parser(
                tool_call_parser, reasoning_parser, enable_auto_tools=True, tool_strict_level=tool_strict_level
            )
            if tool_call_parser
            else None
        )
        self._tokenizer: Any = None

    def over(self, tokenizer: Any) -> OutputParsers:
        """These parsers over the model's tokenizer (checked: vLLM's parsers look up their markers in it)."""
        from vllm.parser import ParserManager

        if self._reasoning is not None:
            try:
                ParserManager.validate_parser_tokenizer(self._reasoning, tokenizer)
            except TypeError as exc:
                why = f"reasoning_parser: {self._names['reasoning_parser']!r} cannot read this model's output"
                raise ValueError(f"{why}: {exc.__cause__}") from None
        self._tokenizer = tokenizer
        return self

    @property
    def reads_tool_calls(self) -> bool:
        return self._tools is not None

    @property
    def reads_reasoning(self) -> bool:
        return self._reasoning is not None

    @property
    def reads_forced_calls(self) -> bool:
        """Whether the tool parser forces calls in the model's own format and reads them as ``auto``'s (vLLM's
        parsers with a structural tag; the others force vLLM's JSON list of calls)."""
        return self._tools is not None and not self._tools.supports_required_and_named

    def tool_constraint(
        self, tools: Sequence[dict[str, Any]], tool_choice: str | dict[str, Any], parallel: bool | None
    ) -> dict[str, str] | None:
        """The structured output vLLM's composed parser gives a request with ``tools`` (its ``adjust_request``), as
        the engine's constraint's fields; None where it gives none or there is no tool parser."""
        if self._both is None:
            return None
        parallel_field = {} if parallel is None else {"parallel_tool_calls": parallel}
        request = _request(tools=list(tools), tool_choice=tool_choice, **parallel_field)
        found = self._both(self._tokenizer, request.tools).adjust_request(request).structured_outputs
        if found is None:
            return None
        if found.structural_tag is not None:
            return {"structural_tag": found.structural_tag}
        schema = found.json
        return {"json": schema if isinstance(schema, str) else json.dumps(schema)} if schema is not None else None

    def tool_reader(self, tools: Sequence[dict[str, Any]]) -> ToolReader | None:
        """A reader of outputs to one request with ``tools`` (OpenAI's definitions); None without a tool parser."""
        if self._tools is None:
            return None
        request = _request(tools=list(tools), tool_choice="auto")
        instance = self._tools(self._tokenizer, request.tools)

        def read(text: str) -> tuple[str | None, list[tuple[str, str]]]:
            found = instance.extract_tool_calls(text, request)
            calls = [(call.function.name, call.function.arguments) for call in found.tool_calls]
            return (found.content, calls) if found.tools_called else (text, [])

        return read

    def output_reader(
        self, prompt_token_ids: Sequence[int], tools: Sequence[dict[str, Any]] | None = None
    ) -> OutputReader | None:
        """A reader of one output to the prompt ``prompt_token_ids``: its thoughts, and with ``tools`` (OpenAI's
        definitions, ``tool_choice: auto``) its calls as they stream; None where these parsers read neither."""
        if tools and self._both is not None:
            request = _request(tools=list(tools), tool_choice="auto")
            parser = self._both(self._tokenizer, request.tools)
            return OutputReader(parser, prompt_token_ids, request, True, self.reads_reasoning)
        if self._reasoning is None:
            return None
        return OutputReader(self._reasoning(self._tokenizer), prompt_token_ids, _request(), False, True)


def _tool_parser(name: str) -> Any:
    from vllm.tool_parsers import ToolParserManager

    try:
        return ToolParserManager.get_tool_parser(name)
    except KeyError:
        names = ", ".join(sorted(ToolParserManager.list_registered()))
        raise ValueError(f"tool_call_parser: {name!r} is not one of vLLM's tool parsers ({names})") from None


def _check_reasoning_parser(name: str) -> None:
    from vllm.reasoning import ReasoningParserManager

    if name not in ReasoningParserManager.list_registered():
        names = ", ".join(ReasoningParserManager.list_registered())
        raise ValueError(f"reasoning_parser: {name!r} is not one of vLLM's reasoning parsers ({names})")
