"""How a batch is cut from the queue: strict FIFO, or length-aware over a bounded look-ahead window.

Both policies are pure functions over a deque of entries (no asyncio, no clock), so they can be tested
exhaustively. Both keep the budget a ceiling, as Hugging Face TEI's queue does: a batch's cost never
exceeds ``target_cost``, except a single record whose own cost exceeds it, which goes alone. A batch's cost
is the sum of its records' costs, or with ``padded`` what a padded engine computes: the batch size times
its largest cost (TEI's budget for padded models).

An entry is the tuple ``(record, cost, future, enqueued_at)``: a tuple, not a class, because one is built
per submitted record and a tuple costs a quarter of a slotted object to make.
"""

from __future__ import annotations

from collections import deque

__all__ = ["COST", "ENQUEUED_AT", "FUTURE", "RECORD", "Entry", "batch_cost", "take_fifo", "take_length_aware"]

Entry = tuple  # (record, cost, future, enqueued_at)
RECORD, COST, FUTURE, ENQUEUED_AT = 0, 1, 2, 3


def batch_cost(count: int, total: int, largest: int, padded: bool) -> int:
    """A batch's cost against the budget: the sum of its costs, or (``padded``) count x the largest."""
    return count * largest if padded else total


def take_fifo(queue: deque[Entry], target_cost: int, max_size: int, padded: bool = False) -> tuple[list[Entry], int]:
    """Pop the longest head-of-queue run that fits the budget and size cap; return it and the sum of
    its costs. The head is never skipped for a smaller record behind it: order is strictly FIFO.
    """
    count = 0
    cost = 0
    largest = 0
    for entry in queue:
        grown = max(largest, entry[COST])
        if count == max_size or (count and batch_cost(count + 1, cost + entry[COST], grown, padded) > target_cost):
            break
        count += 1
        cost += entry[COST]
        largest = grown
        if batch_cost(count, cost, largest, padded) > target_cost:  # a lone oversized record: nothing may join it
            break
    popleft = queue.popleft
    return [popleft() for _ in range(count)], cost


def take_length_aware(
    queue: deque[Entry], target_cost: int, max_size: int, lookahead: int, padded: bool = False, overhead: int = 0
) -> tuple[list[Entry], int]:
    """Pop a batch of similar-cost records from the first ``lookahead`` entries; return it and the sum of
    its costs.

    The oldest entry (the head) is always in the batch; the rest are its nearest neighbours by cost,
    added while they fit. Anchoring on the head is the aging rule: a record at queue position ``p`` is
    dispatched within ``p + 1`` batches, however the lengths fall. Unselected entries keep their order.

    With ``padded`` and an ``overhead`` (what the engine spends on a batch whatever its size, in cost units), a
    neighbour joins only if it raises the batch's useful share, its costs over ``size x largest + overhead``:
    where few records wait and their lengths are far apart, a smaller batch that pads less beats a full one;
    where many of similar length wait, batches still fill the budget.
    """
    if not queue:
        return [], 0
    window = [queue.popleft() for _ in range(min(lookahead, len(queue)))]
    order = sorted(range(len(window)), key=lambda i: window[i][COST])  # stable: ties stay FIFO
    head_cost = window[0][COST]
    chosen = [0]
    cost = largest = head_cost
    lo = order.index(0) - 1
    hi = lo + 2

    def fits(extra: int | None) -> bool:
        if extra is None:
            return False
        count, grown = len(chosen), max(largest, extra)
        if batch_cost(count + 1, cost + extra, grown, padded) > target_cost:
            return False
        # With an overhead: (cost + extra) / ((count + 1) x grown + overhead) > cost / (count x largest + overhead)
        return not (padded and overhead) or (cost + extra) * (count * largest + overhead) > cost * (
            (count + 1) * grown + overhead
        )

    while cost <= target_cost and len(chosen) < max_size and (lo >= 0 or hi < len(order)):
        left = window[order[lo]][COST] if lo >= 0 else None
        right = window[order[hi]][COST] if hi < len(order) else None
        left_fits = fits(left)
        right_fits = fits(right)
        if not (left_fits or right_fits):
            break
        # The nearer neighbour in cost keeps the batch tight; on a tie prefer the smaller one.
        if left_fits and (not right_fits or head_cost - left <= right - head_cost):
            chosen.append(order[lo])
            cost += left
            largest = max(largest, left)
            lo -= 1
        else:
            chosen.append(order[hi])
            cost += right
            largest = max(largest, right)
            hi += 1
    picked = set(chosen)
    chosen.sort()  # hand the batch over in arrival order
    queue.extendleft(reversed([entry for i, entry in enumerate(window) if i not in picked]))
    return [window[i] for i in chosen], cost
