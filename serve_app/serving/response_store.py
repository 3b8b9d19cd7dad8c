"""The Responses API's stored responses (``store``, OpenAI's default), in one Ray actor that every replica of the
cluster reaches: a follow-up naming a ``previous_response_id`` may be routed to another replica than the one that
answered it. Each entry: the Response as it was sent, and the conversation it ended (chat messages, its output
included), the newest ``capacity`` kept."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import ray

from ..errors import NotFoundError

NAME = "token_batching_responses"
NAMESPACE = "token_batching"
CAPACITY = 10_000


@ray.remote(num_cpus=0)
class ResponseStore:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        self.entries[response["id"]] = {"response": response, "conversation": conversation}
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)

    def get(self, response_id: str) -> dict[str, Any] | None:
        return self.entries.get(response_id)

    def delete(self, response_id: str) -> dict[str, Any] | None:
        return self.entries.pop(response_id, None)


def response_store() -> Any:
    """The cluster's store, started by the first replica that needs it (detached: it outlives any one replica)."""
    return ResponseStore.options(name=NAME, namespace=NAMESPACE, get_if_exists=True, lifetime="detached").remote()


async def stored(response_id: str, param: str = "response_id", delete: bool = False) -> dict[str, Any]:
    """The stored entry of ``response_id`` (deleted where ``delete``); a :class:`NotFoundError` naming ``param``
    where the store has none."""
    store = response_store()
    entry = await (store.delete if delete else store.get).remote(response_id)
    if entry is None:
        raise NotFoundError(f"Response with id '{response_id}' not found.", param=param)
    return entry
