"""The token router's session affinity: the replica each session (a client's ``x-session-id`` header, or a handle's
``options(session_id=...)``, which Serve carries as ``RequestMetadata.session_id``) was last sent to.

Why: a session's turns share their history, which that replica most likely still holds in its prefix cache, even
where the router cannot read the prompt (an HTTP body behind Serve's Python proxy, a Responses API follow-up whose
history is stored on the server). The router credits that replica as it credits a cached prefix, within the same
bound (``prefix_max_share`` of its budget): a session stays while its replica holds no more than that share beyond
the others, and moves with its request once it does.

A Responses API follow-up (``previous_response_id``) without a session goes the same way to the replica that made
the response it continues: each replica's response ids carry its tag (:func:`response_id`), since the answer that
carries an id passes the router by (HAProxy or Serve's proxy carries it).

How: the newest ``capacity`` sessions in least-recently-used order, each with its replica and the request that put
it there (a replica's late confirmation of an older request does not move the session back); a replica that leaves
takes its sessions with it. Sessions are keyed by the hash of their id, so a long header costs no memory here.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from functools import lru_cache
from typing import TypeVar

CAPACITY = 10_000
"""Sessions remembered by default (the least recently routed go first)."""

_RESPONSE_ID = re.compile(r"resp_([0-9a-f]{8})[0-9a-f]{24}")
T = TypeVar("T")


@lru_cache(maxsize=1_024)
def replica_tag(replica: str) -> str:
    """The 8 hex digits that the Responses API ids a replica makes start with (a hash of its Serve replica id)."""
    return hashlib.sha1(replica.encode()).hexdigest()[:8]


def response_id(replica: str) -> str:
    """A Responses API id made on ``replica`` (its Serve replica id): ``resp_``, its tag, 24 random hex digits. A
    follow-up naming it (``previous_response_id``) is then routed back to that replica, which holds the conversation
    in its prefix cache: the router never sees the answer that carries the id, so the id itself says where it was
    made."""
    return f"resp_{replica_tag(replica)}{uuid.uuid4().hex[:24]}"


def made_by(previous_response_id: object, replicas: Iterable[tuple[str, T]]) -> T | None:
    """Of ``replicas`` (pairs of a Serve replica id and what stands for it), the one that made
    ``previous_response_id``; None for none of them, or an id not made by :func:`response_id` (then ``replicas`` is
    not read)."""
    found = _RESPONSE_ID.fullmatch(previous_response_id) if isinstance(previous_response_id, str) else None
    if found is None:
        return None
    return next((replica for name, replica in replicas if replica_tag(name) == found[1]), None)


class SessionIndex:
    """The replica each session was last sent to, for the newest ``capacity`` sessions."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"SessionIndex: bad capacity {capacity}")
        self.capacity = capacity
        self._sessions: OrderedDict[int, tuple[Hashable, str]] = OrderedDict()  # hash -> (replica, request id)

    def __len__(self) -> int:
        return len(self._sessions)

    def replica(self, session: str) -> Hashable | None:
        """The replica ``session`` was last sent to; None for no session (``""``) or one not remembered."""
        entry = self._sessions.get(hash(session)) if session else None
        return entry[0] if entry is not None else None

    def sent(self, session: str, replica: Hashable, request: str) -> None:
        """``request`` of ``session`` was routed to ``replica``: the session's newest, the oldest beyond capacity go."""
        if not session:
            return
        key = hash(session)
        self._sessions[key] = (replica, request)
        self._sessions.move_to_end(key)
        while len(self._sessions) > self.capacity:
            self._sessions.popitem(last=False)

    def routed(self, session: str, replica: Hashable, request: str) -> None:
        """``replica`` took ``request``: the session follows it there, unless a newer request of it was sent since."""
        entry = self._sessions.get(hash(session)) if session else None
        if entry is not None and entry[1] == request:
            self._sessions[hash(session)] = (replica, request)

    def replicas(self) -> set[Hashable]:
        return {replica for replica, _ in self._sessions.values()}

    def forget(self, replicas: Iterable[Hashable]) -> None:
        """Drop the sessions of ``replicas`` (they left): their next request goes by tokens alone."""
        gone = set(replicas)
        if gone:
            for key in [key for key, (replica, _) in self._sessions.items() if replica in gone]:
                del self._sessions[key]
