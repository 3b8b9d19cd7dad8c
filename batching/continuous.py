"""``ContinuousBatcher``: token-budgeted *admission* in front of an engine that batches continuously (vLLM).

A static-batch engine wants whole batches (:class:`~batching.DynamicBatcher`). An engine with continuous
batching already packs every request it holds into each step; a batch boundary in front of it is a barrier
that leaves it under-filled while each batch's longest request finishes. What it needs instead is
admission: start each record as soon as its cost fits ``max_inflight_cost - cost in flight`` (and the
in-flight count cap), give its cost back the moment *that* record finishes, and stream its output as it
comes. This is TGI's router and LightLLM's scheduler, as a small asyncio library.

Example::

    async def generate(prompt: Prompt) -> AsyncIterator[str]:      # or an async def returning one result
        async for token in engine.stream(prompt.text):
            yield token

    async with ContinuousBatcher(generate, max_inflight_cost=16_384) as batcher:
        async with await batcher.stream(Prompt("Tell me a story")) as tokens:   # each output as it comes
            async for token in tokens:
                print(token, end="")
        last = await (await batcher.submit(Prompt("2+2?")))          # a future of the last output

Online and batch traffic together: each record has a ``priority`` (lower runs first; vLLM's meaning) and a
``tenant``; lower numbers are admitted first, waiting records age so none starves, lower priorities can be
held to a share of the budget (``low_priority_share``) and of each engine step (``low_priority_step_budget``)
while higher ones are about, and tenants of one priority can share it fairly by admitted cost (``fair_share``).

Guarantees (property-tested): the cost in flight never exceeds the budget except a single record costlier
than the whole budget, which then runs alone; every future and stream handed out ends exactly once; strict
head-of-line admission by default (the record chosen next waits rather than being overtaken: FIFO within a
priority); a cancelled record leaves the queue or the engine at once and its cost returns to the budget;
``stop()`` drains; the queue is bounded.
"""

from __future__ import annotations

import asyncio
import math
import numbers
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, Literal

from .base import positive_int
from .groups import GroupLimit
from .intake import RecordIntake
from .protocols import CostEstimatorFn, RecordT, ResultT
from .record_stream import RecordStream
from .stats import AdmissionStats
from .tickets import peak_cost

__all__ = ["ContinuousBatcher", "RecordStream", "peak_cost"]

StreamFn = Callable[[RecordT], AsyncIterator[ResultT] | Awaitable[ResultT]]
"""``(record) -> outputs``: an async generator (each output is streamed; the last is the result) or an
``async def`` returning the one result."""


def _number(name: str, value: Any, low: float, high: float = math.inf, *, open_low: bool = False) -> float:
    """``value`` as a float within [``low``, ``high``] (``open_low``: above ``low``); else ``ValueError``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not (value > low if open_low else value >= low)
        or not value <= high
    ):
        bounds = f"{'(' if open_low else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name} must be a number in {bounds}, got {value!r}")
    return float(value)


class ContinuousBatcher(RecordIntake, Generic[RecordT, ResultT]):
    """Admit records into ``process_fn`` one by one while their cost in flight fits a budget.

    Args:
        process_fn: ``(record) -> outputs``: an async generator (outputs streamed, the last one is the
            result of :meth:`submit`) or an ``async def`` returning the result. It runs as its own task; a
            cancelled record cancels it (an engine stream aborts its request on cancellation).
        cost_estimator: ``(record) -> int``; otherwise ``record.estimate_tokens()``, then
            ``record.estimate_cost()``, then ``default_cost``. For an LLM: prompt + max_tokens, what the KV
            cache must hold at the end.
        max_inflight_cost: the budget on the cost of records in flight (a ceiling; only a single record
            costlier than the whole budget exceeds it, and it then runs alone).
        max_inflight: most records in flight at once.
        max_queue_size: most records waiting for admission; ``submit``/``stream`` wait beyond it and the
            ``*_nowait`` forms raise :class:`~batching.QueueFullError`.
        order: ``"fifo"`` (strict: the head waits rather than be overtaken) or ``"length_aware"``: the
            cheapest record within the first ``lookahead`` goes first, unless the head has waited
            ``max_wait_s``, which then goes first and waits for room. Both within a priority (and tenant).
        peak_estimate: admit on LightLLM's peak estimate (:func:`peak_cost`) instead of the sum of final
            costs: records part-way through have not grown to their final size, and short ones free their
            tokens before long ones peak, so more fit. Needs each record's ``growth`` (tokens it may add
            while running: ``growth_estimator(record)`` or ``record.estimate_growth()``; 0 otherwise) and
            its progress (``progress_fn(output)`` -> tokens added so far; default: outputs yielded).
        max_queue_wait_s: shed load early: the ``*_nowait`` forms raise :class:`~batching.QueueFullError`
            when the records would have to wait longer than this for admission, estimated from what is queued
            ahead and the rate at which cost and records have been leaving the engine over the last
            ``RATE_WINDOW_S`` (:meth:`expected_wait`; no estimate, and no refusal, before anything has
            finished). A request that would miss its latency objective anyway is better refused at once (503
            + Retry-After) than queued, where it also delays the ones behind it. ``None`` (default): only the
            queue size bounds. Every refusal's ``retry_after_s`` is that estimate.
        priority_fn: ``(record) -> int``, its priority: lower numbers are admitted first (vLLM's meaning:
            interactive calls 0, batch jobs more). Default: ``record.priority``, else 0. Within a priority,
            ``order`` applies (``lookahead`` and ``max_wait_s`` included). Strict head of line across
            priorities too: the record chosen next waits for room rather than let another one pass.
        aging_s: a queued record's effective priority improves by one level for every ``aging_s`` seconds
            it has waited (ties: the lower base priority), so lower priorities are never starved: under a
            stream of fresh priority-``q`` records, one of priority ``p`` goes next once it has waited
            ``(p - q + 1) * aging_s``. ``None``: no aging (strict priority).
        low_priority_share: while a record of a higher priority (a smaller number) is queued or in flight,
            or left within ``share_hold_s``, the records of each lower priority and below may hold together
            at most this share of ``max_inflight_cost`` and of ``max_inflight``, so interactive work that
            arrives while a batch job fills the engine finds room at once. A record of priority ``p`` is
            admitted only if the in-flight cost and count of priorities ``>= p``, with it, stay within the
            share, or if none of them is in flight (a lone record always runs). 1.0 (default): no cap.
        low_priority_step_budget: while the share cap is in force, the records of each lower priority and
            below may also put at most this much together into each of the engine's steps: a record puts its
            cost less its growth (an LLM's prompt, which the engine must process before its first token; growth
            as for ``peak_estimate``) until its first output, then 1 (a token a step). Where a step takes
            longer the more tokens it holds (an LLM on CPU cores), an interactive request waits for the step
            running when it arrives and then for its own: this bounds both, while the batch job keeps the
            engine busy with what fits. A lone record always runs. ``None`` (default): no step budget.
        share_hold_s: how long the share cap outlasts the last higher-priority record (bursts of
            interactive traffic have gaps; without a hold the batch job refills the engine in each one).
        fair_share: share each priority fairly between tenants (token-weighted virtual counters, VTC:
            Sheng et al., OSDI'24): the tenant with the least admitted cost goes next; a tenant that comes
            back after being idle starts level with the least served of those waiting, so idle time banks
            no credit. Two tenants with backlogs get admitted cost within one record's cost of each
            other. Default off: arrival order across tenants.
        tenant_fn: ``(record) -> hashable``, its tenant for ``fair_share`` and the per-tenant ``stats`` (an API
            key, the OpenAI ``user``, a job id). Default: ``record.tenant``, else None (one shared tenant).
        group_fn: ``(record) -> hashable``, its group, or None (no group). With ``max_groups``, at most that many
            distinct groups are in flight at once: an LLM engine's LoRA adapters, of which it runs at most a few
            in one step (vLLM's ``max_loras``; a request of another adapter waits inside the engine, out of this
            queue's order, for one to leave). A record whose group must wait is passed by the records of groups
            in flight behind it; once it has waited ``max_wait_s``, the group in flight that leaves soonest (the
            fewest tokens its longest record may still add; ties, the fewest records) takes no more until it has
            left and the record takes its place, while the others go on. Records of no group are not counted.
            Default: no groups.
        max_groups: see ``group_fn``; None (default): no limit.
        on_deck: with ``max_groups``, the group a group drains for goes in at once, one beyond ``max_groups``,
            to wait inside the engine for the draining group's place: an engine that queues what it cannot run
            yet (vLLM's scheduler holds a request of another adapter until a LoRA slot frees) starts it in the
            step the place frees, not a step or two later when this queue has seen the last record leave.
            Default off: the engine sees at most ``max_groups`` groups.
        prefix_fn: ``(record) -> keys``, the keys of its prompt's leading blocks, each naming its block and
            every block before it (as vLLM's prefix cache keys its KV blocks), each block costing ``block_cost``
            of its cost. A block that a record in flight holds already costs nothing more: records sharing a
            prompt's start (a system prompt, a conversation's history) are charged for it once while any of them
            runs, as the engine holds it once, and it leaves the cost in flight with the last of them. The summed
            budget only: the peak estimate, the share cap of lower priorities and fair share count every record
            whole. Default: none shared.
        block_cost: what one of ``prefix_fn``'s blocks costs (an LLM: its KV cache's block size in tokens).
        coalesce_fn: ``(earlier, later) -> output`` or None: joins a record's outputs that wait in its
            :class:`RecordStream` for a consumer that fell behind into one (None: those two stay apart, say the
            last). An engine's token deltas: the reader takes what came while it was busy in one piece, as
            vLLM's own output collector does. Outputs are not held back to be joined unless paced
            (``stream_interval_s``). Default: none joined.
        stream_interval_s: with ``coalesce_fn``, a record's consumer takes at most one output this often: one
            that comes sooner waits (at most this long) and goes joined with what comes meanwhile, while the
            first and the end go at once. Fewer, larger outputs cost the consumer less where the engine makes
            them faster than they are worth sending one by one (tokens to a socket). Default 0: each at once.
        default_cost: the cost of a record with no other estimate.
        latency_samples: how many recent per-record latencies the percentiles in ``stats`` cover.
    """

    _cost_methods: tuple[str, ...] = ("estimate_tokens", "estimate_cost")

    def __init__(
        self,
        process_fn: StreamFn[RecordT, ResultT],
        *,
        cost_estimator: CostEstimatorFn[RecordT] | None = None,
        max_inflight_cost: int = 32_000,
        max_inflight: int = 256,
        max_queue_size: int = 5_000,
        order: Literal["fifo", "length_aware"] = "fifo",
        lookahead: int = 64,
        max_wait_s: float = 2.0,
        peak_estimate: bool = False,
        growth_estimator: CostEstimatorFn[RecordT] | None = None,
        progress_fn: Callable[[ResultT], int] | None = None,
        max_queue_wait_s: float | None = None,
        priority_fn: Callable[[RecordT], int] | None = None,
        aging_s: float | None = 30.0,
        low_priority_share: float = 1.0,
        low_priority_step_budget: int | None = None,
        share_hold_s: float = 5.0,
        fair_share: bool = False,
        tenant_fn: Callable[[RecordT], Hashable | None] | None = None,
        group_fn: Callable[[RecordT], Hashable | None] | None = None,
        max_groups: int | None = None,
        on_deck: bool = False,
        prefix_fn: Callable[[RecordT], Sequence[Hashable]] | None = None,
        block_cost: int = 1,
        coalesce_fn: Callable[[ResultT, ResultT], ResultT | None] | None = None,
        stream_interval_s: float = 0.0,
        default_cost: int = 1,
        latency_samples: int = 10_000,
    ) -> None:
        functions = (
            ("priority_fn", priority_fn),
            ("tenant_fn", tenant_fn),
            ("group_fn", group_fn),
            ("prefix_fn", prefix_fn),
        )
        for name, fn in (*functions, ("coalesce_fn", coalesce_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable or None, got {fn!r}")
        self._priority_fn = priority_fn
        self._tenant_fn = tenant_fn
        self._group_fn = group_fn
        self._groups = GroupLimit(None if max_groups is None else positive_int("max_groups", max_groups), bool(on_deck))
        self._prefix_fn = prefix_fn
        self._block_cost = positive_int("block_cost", block_cost)
        self._held = {}
        self._coalesce_fn = coalesce_fn
        self._stream_interval = _number("stream_interval_s", stream_interval_s, 0.0)
        self._aging = None if aging_s is None else _number("aging_s", aging_s, 0.0, open_low=True)
        self._share = _number("low_priority_share", low_priority_share, 0.0, 1.0, open_low=True)
        self._step_budget = (
            None
            if low_priority_step_budget is None
            else positive_int("low_priority_step_budget", low_priority_step_budget)
        )
        self._share_hold = _number("share_hold_s", share_hold_s, 0.0)
        self._fair = bool(fair_share)  # the queue (made in super().__init__) needs these four
        super().__init__(
            process_fn,
            cost_estimator,
            max_queue_size=max_queue_size,
            default_cost=default_cost,
            latency_samples=latency_samples,
        )
        if growth_estimator is not None and not callable(growth_estimator):
            raise TypeError(f"growth_estimator must be callable or None, got {growth_estimator!r}")
        if order not in ("fifo", "length_aware"):
            raise ValueError(f"order must be 'fifo' or 'length_aware', got {order!r}")
        self._max_wait = _number("max_wait_s", max_wait_s, 0.0)
        self._max_queue_wait = (
            None if max_queue_wait_s is None else _number("max_queue_wait_s", max_queue_wait_s, 0.0, open_low=True)
        )
        self._growth_estimator = growth_estimator
        self._progress_fn = progress_fn
        self._budget = positive_int("max_inflight_cost", max_inflight_cost)
        self._max_inflight = positive_int("max_inflight", max_inflight)
        self._order = order
        self._lookahead = positive_int("lookahead", lookahead)
        self._peak = bool(peak_estimate)

        self._running = set()
        self._inflight_cost = 0
        self._drained = None
        self._halted = False
        self._share_timer = None

    # -- Public API ----------------------------------------------------------------------------------

    @property
    def budget(self) -> int:
        """The in-flight cost budget (``max_inflight_cost``)."""
        return self._budget

    @property
    def inflight_cost(self) -> int:
        """The summed cost of the records in flight now (a prefix block they share counted once: ``prefix_fn``)."""
        return self._inflight_cost

    @property
    def stats(self) -> AdmissionStats:
        """A fresh :class:`~batching.AdmissionStats` snapshot; ``stats.to_dict()`` gives a plain dict for export."""
        return self._stats.snapshot(
            len(self._queue),
            self._queued_cost,
            len(self._running),
            self._inflight_cost,
            self._budget,
            self._queue.held_by_priority(),
            self._queue.queued_by_tenant(),
        )

    async def submit(self, record: RecordT, *, estimated_cost: int | None = None) -> asyncio.Future[ResultT]:
        """Queue one record; returns the future of its result (its last output). Waits while the queue is
        full. Cancelling the future withdraws the record."""
        ticket = await self._enqueue(record, estimated_cost, self._new_future())
        return ticket.sink

    def submit_nowait(self, record: RecordT, *, estimated_cost: int | None = None) -> asyncio.Future[ResultT]:
        """Like :meth:`submit`, but raises :class:`~batching.QueueFullError` instead of waiting."""
        return self._enqueue_nowait([record], [estimated_cost], stream=False)[0]

    def submit_batch_nowait(
        self, records: Sequence[RecordT], *, estimated_cost: Sequence[int | None] | None = None
    ) -> list[asyncio.Future[ResultT]]:
        """All or nothing: one future per record, or :class:`~batching.QueueFullError` unless all fit."""
        return self._enqueue_nowait(records, self._explicit(records, estimated_cost), stream=False)

    async def stream(self, record: RecordT, *, estimated_cost: int | None = None) -> RecordStream[ResultT]:
        """Queue one record; returns its :class:`RecordStream`. Waits while the queue is full."""
        ticket = await self._enqueue(record, estimated_cost, None)
        return ticket.sink

    def stream_nowait(self, record: RecordT, *, estimated_cost: int | None = None) -> RecordStream[ResultT]:
        """Like :meth:`stream`, but raises :class:`~batching.QueueFullError` instead of waiting."""
        return self._enqueue_nowait([record], [estimated_cost], stream=True)[0]

    def stream_batch_nowait(
        self, records: Sequence[RecordT], *, estimated_cost: Sequence[int | None] | None = None
    ) -> list[RecordStream[ResultT]]:
        """All or nothing: one stream per record, or :class:`~batching.QueueFullError` unless all fit."""
        return self._enqueue_nowait(records, self._explicit(records, estimated_cost), stream=True)
