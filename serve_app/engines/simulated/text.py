"""The SIMULATED engine's text: its tokenizer (one token per 4 characters, or a model's own), its chat template,
and the scripted replies a prompt asks for by number."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ...config import SimulatedSettings
from .sequence import CHARS_PER_TOKEN


class SimulatedText:
    """Tokenizes, renders chats and scripts replies for the simulated engine."""

    def __init__(self, settings: SimulatedSettings, tokenizer: str | None = None) -> None:
        """``tokenizer``: a model folder whose tokenizer it uses (so vLLM's output parsers can read its replies)."""
        self.settings = settings
        self.tokenizer: Any = None
        if tokenizer is not None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer)

    @staticmethod
    def tokens(text: str) -> list[int]:
        """The simulated tokenizer: one token per 4 characters."""
        return [sum(text[i : i + CHARS_PER_TOKEN].encode()) for i in range(0, len(text), CHARS_PER_TOKEN)]

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return self.tokens(text)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        template: Mapping[str, Any] | None = None,
    ) -> str:
        """The simulated chat template: each message as ``<|role|>content``, the tools and tool calls as JSON, then
        the assistant's generation prompt; with ``continue_final_message`` the last message is left open instead."""
        template = template or {}
        shown = f"<|tools|>{json.dumps(list(tools))}\n" if tools else ""
        calls = (f"<|calls|>{json.dumps(m['tool_calls'])}" if m.get("tool_calls") else "" for m in messages)
        text = shown + "".join(f"<|{m['role']}|>{m['content']}{c}\n" for m, c in zip(messages, calls))
        if template.get("continue_final_message"):
            return text.removesuffix("\n")
        return text + ("<|assistant|>" if template.get("add_generation_prompt", True) else "")

    def decode(self, token_ids: Sequence[int]) -> str:
        if self.tokenizer is not None:
            return self.tokenizer.decode(list(token_ids))
        return " ".join(f"t{token}" for token in token_ids)

    def script(self, prompt: str) -> list[tuple[str, int]] | None:
        """The reply a prompt asks for by number (``replies``; the last it asks for: a conversation's latest turn), as
        (text, id) tokens; None: it asks for none."""
        asked = re.findall(re.escape(self.settings.reply_marker) + r"(\d+)", prompt) if self.settings.replies else []
        if not asked or int(asked[-1]) >= len(self.settings.replies):
            return None
        reply = self.settings.replies[int(asked[-1])]
        if self.tokenizer is None:
            chunks = [reply[i : i + CHARS_PER_TOKEN] for i in range(0, len(reply), CHARS_PER_TOKEN)]
            return [(chunk, sum(chunk.encode())) for chunk in chunks] or None
        ids, said, out = self.encode(reply), "", []
        for k, token in enumerate(ids):  # each token's text as a detokenizer streams it
            text = self.tokenizer.decode(ids[: k + 1])
            out.append((text[len(said) :], token))
            said = text
        return out or None
