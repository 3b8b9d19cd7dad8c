"""Token-aware request routing (``routing.router: tokens``, Ray Serve 2.60's ``RequestRouter``): each request goes
to the replica that would hold the fewest tokens for its budget with it. Serve's default router counts ongoing
requests, to which a 48-prompt ``generate_batch`` call is one request, as a 16-token chat is.

A replica's held tokens are its latest report (:mod:`.reports`) plus what this router sent it since, less what ended
there (:mod:`.books`); a prompt prefix or session the replica likely holds is a credit (:mod:`.prefixes`,
:mod:`.sessions`), a LoRA adapter it must load a charge (:mod:`.adapters`); a request's cost is estimated from its
arguments or body (:mod:`.request_cost`). Where a report is missing or stale, Serve's power of two choices decides.
docs/fleet.md tells the whole of it. Every process that routes imports this module, which imports nothing of the
app but two metric names and this package's ledgers and indexes.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import (
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from ..autoscaling import PROMPTS, TOKEN_BUDGET, TOKEN_LOAD
from .adapters import AdapterIndex
from .books import Ledger, Routed
from .prefixes import PREFIX_CACHE_TOKENS, PrefixIndex, prompt_text
from .reports import Reports
from .request_cost import handle_prompt, pending_cost, previous_response
from .sessions import SessionIndex, made_by

if TYPE_CHECKING:
    from ray.serve._private.replica_result import ReplicaResult

logger = logging.getLogger("serve_app")


def _key(request: PendingRequest) -> tuple[int, float]:
    """A pending request's identity while it is routed (a retry is the same object; it is not hashable)."""
    return id(request), request.created_at


class TokenLoadRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    """Ranks replicas by the tokens they hold (see the module's docstring). ``request_router_kwargs``:

    Args:
        stale_after_s: a report older than this (or none yet) sends every request through Serve's power of two
            choices until all replicas report again.
        default_max_tokens: ``max_tokens`` of a request that does not say (the app's ``sampling.max_tokens``).
        settle_s: a report measured less than this after a request was routed may not count it yet (the hop to
            the replica, tokenizing): until a later one, the router still adds it.
        tie_fraction: replicas whose held tokens differ by less than this share of their budget tie.
        unknown_cost: tokens of a request whose cost cannot be read; default: 128 + ``default_max_tokens``.
        prefix_weight: what a prompt token the replica holds in its prefix cache takes off its load, in tokens
            (0: no prefix score).
        prefix_max_share: the most the prefix score takes off a replica's load, as a share of its budget.
        prefix_block_chars: characters of a prompt block in the prefix index (vLLM's blocks hold 16 tokens).
        prefix_capacity_blocks: the blocks the prefix index keeps for each replica (least recently used go), fewer
            where the replica reports a smaller prefix cache.
        adapter_weight: what loading a LoRA adapter costs a replica, in tokens: added to the load of each replica
            that does not hold the request's adapter, twice where its adapter slots are full (0: no adapter score).
        base_model: the base model's name, which a request's ``model`` may give: no adapter.
        session_affinity: credit the replica a request's session was last sent to (or, without one, the replica
            that made the Responses API response it continues), up to ``prefix_max_share``.
    """

    def initialize_state(
        self,
        stale_after_s: float = 5.0,
        default_max_tokens: int = 128,
        settle_s: float = 0.1,
        tie_fraction: float = 0.01,
        unknown_cost: float | None = None,
        prefix_weight: float = 4.0,
        prefix_max_share: float = 1.0,
        prefix_block_chars: int = 64,
        prefix_capacity_blocks: int = 65_536,
        adapter_weight: float = 0.0,
        base_model: str | None = None,
        session_affinity: bool = True,
    ) -> None:
        if (
            stale_after_s <= 0
            or default_max_tokens < 1
            or settle_s < 0
            or tie_fraction < 0
            or prefix_weight < 0
            or prefix_max_share < 0
            or adapter_weight < 0
            or not isinstance(session_affinity, bool)
        ):
            raise ValueError(
                f"TokenLoadRouter: bad settings stale_after_s={stale_after_s} default_max_tokens={default_max_tokens} "
                f"settle_s={settle_s} tie_fraction={tie_fraction} prefix_weight={prefix_weight} "
                f"prefix_max_share={prefix_max_share} adapter_weight={adapter_weight} "
                f"session_affinity={session_affinity!r}"
            )
        self.prefix_weight = prefix_weight
        self.prefix_max_share = prefix_max_share
        self._prefixes = PrefixIndex(prefix_block_chars, prefix_capacity_blocks)
        self.adapter_weight, self.base_model = adapter_weight, base_model
        self._adapters = AdapterIndex(settle_s)
        self.session_affinity = session_affinity
        self._sessions = SessionIndex()  # where each session was last sent
        self.stale_after_s = stale_after_s
        self.default_max_tokens = default_max_tokens
        self.settle_s = settle_s
        self.tie_fraction = tie_fraction
        self.unknown_cost = float(unknown_cost if unknown_cost is not None else 128 + default_max_tokens)
        self._ledger = Ledger(settle_s, stale_after_s)  # what was sent where, until it completes
        self._reports = Reports()  # the newest report of each replica
        self._degraded = False
        self._clock = time.time  # the router's clock (reports carry the replica's): a test may set its own

    # -- Cost and load --------------------------------------------------------------------------------------

    def estimate_cost(self, request: PendingRequest) -> float:
        """Tokens ``request`` will hold at its replica (prompt + max_tokens per prompt), estimated."""
        cost: float | None = None
        try:
            cost = pending_cost(request, self.default_max_tokens)
        except Exception:  # never fail a request over an estimate
            logger.debug("token router: no cost estimate for %s", request.metadata.call_method, exc_info=True)
        return self.unknown_cost if cost is None else cost

    def prefix_keys(self, request: PendingRequest) -> list[int]:
        """The prefix index's keys of the request's prompt: a handle call's, or the body's fields the ingress router
        passes as one; none for a batch of several prompts, an HTTP request whose body is unread, or no prefix score."""
        if self.prefix_weight == 0 or request.metadata.is_http_request:
            return []
        prompt = handle_prompt(request.metadata.call_method, request.args, request.kwargs)
        if request.metadata.call_method == "generate_batch":
            prompt = prompt[0] if isinstance(prompt, (list, tuple)) and len(prompt) == 1 else None
        text, salt = prompt_text(prompt), request.kwargs.get("cache_salt")
        return self._prefixes.keys(text, salt if isinstance(salt, str) else None) if text else []

    def adapter(self, request: PendingRequest) -> str | None:
        """The LoRA adapter a request names (a handle call's ``model``, or the body's under the ingress router);
        None for the base model (``base_model``) or no name."""
        model = request.kwargs.get("model") if self.adapter_weight > 0 else None
        return model if isinstance(model, str) and model != self.base_model else None

    def loading(self, replicas: Sequence[RunningReplica], adapter: str | None) -> dict[ReplicaID, float]:
        """The tokens each replica is charged for ``adapter`` (:meth:`.adapters.AdapterIndex.charges`)."""
        if adapter is None:
            return {}
        reports = {r.replica_id: self._reports.of(r) for r in replicas}
        return self._adapters.charges(reports, adapter, self.adapter_weight)  # type: ignore[return-value]

    def held_tokens(self, replica: RunningReplica, now: float) -> float | None:
        """Tokens ``replica`` holds: its last report, less what it counts that has completed since, plus what was
        sent to it since (and has not completed); ``None`` when that report is missing or stale."""
        load = self._report(replica, now)
        if load is None:
            return None
        books = self._ledger.books.get(replica.replica_id)
        return load if books is None else books.held(load)

    def _report(self, replica: RunningReplica, now: float) -> float | None:
        """The token load of ``replica``'s latest report, which its books take in (``None``: none, or stale)."""
        stats = self._reports.of(replica)
        load, at = stats.get(TOKEN_LOAD), stats.get("at")
        if not isinstance(load, (int, float)) or not isinstance(at, (int, float)) or now - at > self.stale_after_s:
            return None
        books = self._ledger.books.get(replica.replica_id)
        if books is not None:
            books.report(at, now)
        return float(load)

    def rank(
        self,
        replicas: Sequence[RunningReplica],
        held: dict[ReplicaID, float],
        cost: float,
        cached: dict[ReplicaID, float] | None = None,
        loading: dict[ReplicaID, float] | None = None,
        session: ReplicaID | None = None,
    ) -> list[RunningReplica]:
        """``replicas`` best first: by held tokens (+ ``cost``, - the prefix score of the ``cached`` prompt tokens
        each holds or, for the ``session``'s replica, its whole bound, + the tokens of ``loading`` the request's
        adapter) over budget; ties by locality, queue, chance."""
        budgets = {r.replica_id: float(self._reports.of(r).get(TOKEN_BUDGET) or 0) for r in replicas}
        by_share = all(b > 0 for b in budgets.values())
        tie = self.tie_fraction if by_share else self.tie_fraction * max(budgets.values(), default=0.0)
        largest = max(budgets.values(), default=0.0)

        def load(r: RunningReplica) -> float:
            bound = self.prefix_max_share * (budgets[r.replica_id] or largest)  # the one guard, for both credits
            prefix = self.prefix_weight * (cached or {}).get(r.replica_id, 0.0)
            credit = bound if r.replica_id == session else min(prefix, bound)
            after = held[r.replica_id] + cost - credit + (loading or {}).get(r.replica_id, 0.0)
            return after / budgets[r.replica_id] if by_share else after

        node, zone = self._self_node_id, self._self_availability_zone

        def tie_break(r: RunningReplica) -> tuple[int, float, float]:
            here = self._prefer_local_node_routing and node is not None and r.node_id == node
            near = self._prefer_local_az_routing and zone is not None and r.availability_zone == zone
            books = self._ledger.books.get(r.replica_id)
            queue = max(0.0, float(self._reports.of(r).get(PROMPTS) or 0) + (books.requests if books else 0))
            return 0 if here else 1 if near else 2, queue, random.random()

        ranked: list[RunningReplica] = []
        group: list[RunningReplica] = []
        for replica in sorted(replicas, key=load):
            if group and load(replica) - load(group[0]) > tie:
                ranked += sorted(group, key=tie_break)
                group = []
            group.append(replica)
        return ranked + sorted(group, key=tie_break)

    # -- Serve's interface ----------------------------------------------------------------------------------

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        """Every candidate, best first, one per rank (Serve takes the first that is not full); Serve's power of two
        choices where a report is missing or stale, or for a multiplexed model."""
        if not candidate_replicas or pending_request is None or pending_request.metadata.multiplexed_model_id:
            return await self._power_of_two(candidate_replicas, pending_request)
        self._reports.start(lambda: list(self._replicas.values()))  # where this process polls (the ingress router)
        now = self._clock()
        held = {r.replica_id: self.held_tokens(r, now) for r in candidate_replicas}
        if any(h is None for h in held.values()):
            if not self._degraded:
                # A replica that has not reported yet (start-up, a new replica) is routine (INFO); a report older
                # than stale_after_s means a replica or Serve's relay of its reports has fallen behind (WARNING).
                missing = [r for r in candidate_replicas if held[r.replica_id] is None]
                stale = sum(isinstance(self._reports.of(r).get("at"), (int, float)) for r in missing)
                logger.log(
                    logging.WARNING if stale else logging.INFO,
                    "token router: %d replica(s) without a fresh report (%d stale); ongoing requests decide",
                    len(missing),
                    stale,
                )
                self._degraded = True
            return await self._power_of_two(candidate_replicas, pending_request)
        if self._degraded:
            logger.info("token router: every replica reports; routing by tokens again")
            self._degraded = False
        key, internal_id = _key(pending_request), pending_request.metadata.internal_request_id
        previous = self._ledger.previous(key, internal_id)
        cost = previous.cost if previous is not None else self.estimate_cost(pending_request)
        keys = self.prefix_keys(pending_request)
        tokens = self._prefixes.block_tokens
        cached = {r.replica_id: self._prefixes.matched(r.replica_id, keys) * tokens for r in candidate_replicas}
        adapter = self.adapter(pending_request)
        loading = self.loading(candidate_replicas, adapter)
        meta = pending_request.metadata
        session = meta.session_id if self.session_affinity else ""
        went = self._sessions.replica(session)
        if went is None and self.session_affinity:  # a Responses API follow-up: where its response was made
            previous = previous_response(meta.call_method, pending_request.args, pending_request.kwargs)
            went = made_by(previous, ((r.replica_id.unique_id, r.replica_id) for r in candidate_replicas))
        ranked = self.rank(candidate_replicas, held, cost, cached, loading, went)  # type: ignore[arg-type]
        chosen = ranked[0].replica_id
        reported = self._reports.of(ranked[0]).get(PREFIX_CACHE_TOKENS)
        self._prefixes.record(chosen, keys, reported if isinstance(reported, (int, float)) else None)
        self._sessions.sent(session, chosen, internal_id)
        if adapter is not None:
            self._adapters.sent(chosen, adapter, now)
        self._ledger.choose(key, Routed(internal_id, cost, chosen, now, shared=cached[chosen]))
        pending_request.routing_context.should_backoff = True  # back off between passes when every replica is full
        return [[replica] for replica in ranked]

    async def _power_of_two(
        self, candidates: list[RunningReplica], request: PendingRequest | None
    ) -> list[list[RunningReplica]]:
        return await PowerOfTwoChoicesRequestRouter.choose_replicas(self, candidates, request)  # type: ignore[arg-type]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult) -> None:
        """The replica took the request: count it there from now until a report counts it (unless it has
        completed already: a unary call over gRPC is confirmed with its answer)."""
        internal_id = pending_request.metadata.internal_request_id
        cost = partial(self.estimate_cost, pending_request)
        self._ledger.routed(_key(pending_request), internal_id, replica_id, cost, self._clock())
        self._sessions.routed(pending_request.metadata.session_id, replica_id, internal_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """It finished (or was refused): it holds nothing there any more, and the replica's latest report, if
        measured while it ran, holds that much less."""
        now = self._clock()
        routed = self._ledger.end(internal_request_id, replica_id, now)
        if routed is None:
            return
        replica = self._replicas.get(replica_id)
        if replica is not None:
            self._report(replica, now)  # weigh the end against the report the router has now
        self._ledger.book(replica_id).complete(routed, now)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._ledger.forget(set(self._ledger.books) - self._replica_id_set)
        self._prefixes.forget(self._prefixes.replicas() - self._replica_id_set)
        self._adapters.forget(self._adapters.replicas() - self._replica_id_set)
        self._sessions.forget(self._sessions.replicas() - self._replica_id_set)
        self._reports.forget(set(self._reports.replicas()) - self._replica_id_set)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._ledger.forget({replica_id})
        self._prefixes.forget({replica_id})
        self._adapters.forget({replica_id})
        self._sessions.forget({replica_id})
        self._reports.forget({replica_id})
