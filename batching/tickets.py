"""What the continuous batcher queues and runs: one :class:`Ticket` per submitted record, and LightLLM's peak
estimate (:func:`peak_cost`) of what the records in flight will hold."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from typing import Any

from .record_stream import RecordStream

__all__ = ["ADMITTED", "DONE", "NO_OUTPUT", "QUEUED", "Ticket", "peak_cost"]

QUEUED, ADMITTED, DONE = 0, 1, 2
NO_OUTPUT = object()


def peak_cost(running: Sequence[tuple[int, int]]) -> int:
    """LightLLM's peak estimate: the most tokens ``running`` will ever hold at once.

    Each item is ``(tokens held now, tokens it may still add)``. Sorted by what they may still add, longest
    first, the ``i``-th request finishes last among the ``i + 1`` longest; at that moment those ``i + 1``
    have each grown by its remaining length while every shorter one has already freed its tokens.

    >>> peak_cost([(100, 10), (100, 50)])   # 220, not 260: the short one leaves before the long one peaks
    220
    """
    peak = held = 0
    for count, (now, remaining) in enumerate(sorted(running, key=lambda item: -item[1]), start=1):
        held += now
        peak = max(peak, held + remaining * count)
    return peak


class Ticket:
    """One submitted record: where it is, what it costs, its priority, tenant and group, and where its outputs
    go."""

    __slots__ = (
        "blocks",
        "cost",
        "enqueued_at",
        "first_output",
        "group",
        "growth",
        "last",
        "priority",
        "produced",
        "record",
        "seq",
        "sink",
        "started_at",
        "state",
        "task",
        "tenant",
    )

    def __init__(
        self,
        record: Any,
        cost: int,
        growth: int,
        sink: asyncio.Future | RecordStream,
        now: float,
        priority: int = 0,
        tenant: Hashable = None,
        group: Hashable = None,
        blocks: tuple[Hashable, ...] = (),
    ) -> None:
        self.record = record
        self.cost = cost
        self.growth = growth
        self.sink = sink
        self.enqueued_at = now
        self.priority = priority  # lower runs first (vLLM's meaning)
        self.tenant = tenant  # whom fair share charges (None: the shared tenant)
        self.group = group  # what at most max_groups of run at once (a LoRA adapter; None: no group)
        self.blocks = blocks  # its prompt's leading blocks' keys, each costing block_cost (see prefix_fn)
        self.seq = 0  # arrival order, set when queued
        self.state = QUEUED
        self.task: asyncio.Task | None = None
        self.produced = 0  # tokens added so far (the peak estimate's progress)
        self.started_at = 0.0
        self.first_output = False
        self.last: Any = NO_OUTPUT

    def step_load(self) -> int:
        """What it puts into each of the engine's steps: its cost less its growth (an LLM's prompt, at least 1)
        until its first output, then 1 (a token a step)."""
        return 1 if self.first_output else max(1, self.cost - self.growth)

    def held(self) -> tuple[int, int]:
        """(tokens held now, tokens it may still add), for :func:`peak_cost`."""
        produced = min(self.produced, self.growth)
        return self.cost - self.growth + produced, self.growth - produced
