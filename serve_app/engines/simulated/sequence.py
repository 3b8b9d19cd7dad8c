"""One request inside the SIMULATED engine: the tokens it says (the prompt's words echoed, or a scripted reply) and
how far it has got."""

from __future__ import annotations

import asyncio

from ..outputs import GenerationOutput
from ..requests import GenerationRequest

CHARS_PER_TOKEN = 4
PREFIX = "[simulated] "


class SimulatedSequence:
    """One request inside the simulated engine."""

    __slots__ = (
        "aborted",
        "cached",
        "finished",
        "outputs",
        "prefilled",
        "produced",
        "request",
        "script",
        "sent",
        "words",
    )

    def __init__(self, request: GenerationRequest, script: list[tuple[str, int]] | None = None) -> None:
        self.request = request
        self.words = request.prompt_text.split() or ["..."]
        self.script = script
        self.produced = 0
        self.sent = 0  # tokens passed on in deltas so far
        self.prefilled = False
        self.cached: int | None = None  # prompt tokens its engine's prefix cache held; None: no prefix cache
        self.finished = False
        self.aborted = False
        self.outputs: asyncio.Queue[GenerationOutput | BaseException] = asyncio.Queue()

    def token_text(self, index: int) -> str:
        if self.script is not None:
            return self.script[index][0]
        word = self.words[index % len(self.words)]
        adapter = self.request.sampling.adapter
        prefix = PREFIX if adapter is None else f"[simulated {adapter}] "  # an adapter's answer shows its name
        return prefix + word if index == 0 else " " + word

    def token_id(self, index: int) -> int:
        """The id of output token ``index``: the script's, or the sum of its text's bytes."""
        return self.script[index][1] if self.script is not None else sum(self.token_text(index).encode())

    @property
    def limit(self) -> int:
        """The tokens it will produce: ``max_tokens``, or its script's where that ends first."""
        budget = self.request.sampling.max_tokens
        return budget if self.script is None else min(budget, len(self.script))

    def end_reason(self) -> str:
        return "stop" if self.script is not None and self.produced >= len(self.script) else "length"

    def context(self) -> int:
        return len(self.request.prompt_token_ids) + self.produced
