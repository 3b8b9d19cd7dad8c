"""How a batch is cut from the queue: strict FIFO, or length-aware over a bounded look-ahead window.

Both policies are pure functions over a deque of entries (no asyncio, no clock), so they can be tested
exhaustively. Both keep the budget a ceiling, as Hugging Face TEI's queue does: a batch's total cost never
exceeds ``target_cost``, except a single record whose own cost exceeds it, which goes alone.

An entry is the tuple ``(record, cost, future, enqueued_at)``: a tuple, not a class, because one is built
per submitted record and a tuple costs a quarter of a slotted object to make.
"""

from __future__ import annotations

from collections import deque

__all__ = ["COST", "ENQUEUED_AT", "FUTURE", "RECORD", "Entry", "take_fifo", "take_length_aware"]

Entry = tuple  # (record, cost, future, enqueued_at)
RECORD, COST, FUTURE, ENQUEUED_AT = 0, 1, 2, 3


def take_fifo(queue: deque[Entry], target_cost: int, max_size: int) -> tuple[list[Entry], int]:
    """Pop the longest head-of-queue run that fits the budget and size cap; return it and its cost.

    The head is never skipped for a smaller record behind it: order is strictly first in, first out.
    """
    count = 0
    cost = 0
    for entry in queue:
        if count == max_size or (count and cost + entry[COST] > target_cost):
            break
        count += 1
        cost += entry[COST]
        if cost > target_cost:  # a lone oversized record: nothing may join it
            break
    popleft = queue.popleft
    return [popleft() for _ in range(count)], cost


def take_length_aware(queue: deque[Entry], target_cost: int, max_size: int, lookahead: int) -> tuple[list[Entry], int]:
    """Pop a batch of similar-cost records from the first ``lookahead`` entries; return it and its cost.

    The oldest entry (the head) is always in the batch; the rest are its nearest neighbours by cost,
    added while they fit. Anchoring on the head is the aging rule: a record at queue position ``p`` is
    dispatched within ``p + 1`` batches, however the lengths fall. Unselected entries keep their order.
    """
    if not queue:
        return [], 0
    window = [queue.popleft() for _ in range(min(lookahead, len(queue)))]
    order = sorted(range(len(window)), key=lambda i: window[i][COST])  # stable: ties stay FIFO
    head_cost = window[0][COST]
    chosen = [0]
    cost = head_cost
    lo = order.index(0) - 1
    hi = lo + 2
    while cost <= target_cost and len(chosen) < max_size and (lo >= 0 or hi < len(order)):
        left = window[order[lo]][COST] if lo >= 0 else None
        right = window[order[hi]][COST] if hi < len(order) else None
        left_fits = left is not None and cost + left <= target_cost
        right_fits = right is not None and cost + right <= target_cost
        if not (left_fits or right_fits):
            break
        # The nearer neighbour in cost keeps the batch tight; on a tie prefer the smaller one.
        if left_fits and (not right_fits or head_cost - left <= right - head_cost):
            chosen.append(order[lo])
            cost += left
            lo -= 1
        else:
            chosen.append(order[hi])
            cost += right
            hi += 1
    picked = set(chosen)
    chosen.sort()  # hand the batch over in arrival order
    queue.extendleft(reversed([entry for i, entry in enumerate(window) if i not in picked]))
    return [window[i] for i in chosen], cost
