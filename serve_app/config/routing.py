"""How callers pick a generation replica: the token router's signals (tokens held, prefix, adapter, session) and
their weights, or Serve's default router (``routing`` in the generation app's ``args``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .common import Strict


class RoutingSettings(Strict):
    """How callers (the HTTP proxy, handles) pick a replica. `tokens`: the replica holding the fewest tokens
    (queued + in flight, as each replica reports them, plus what was routed to it since), so a 48-prompt batch
    counts as 48 prompts, not one request; Serve's power of two choices on ongoing requests where a replica's
    report is stale. `serve`: Serve's default router, as shipped. With `autoscaling.max_replicas: 1` there is nothing
    to pick, and Serve's router is used either way (under HAProxy, no hop to the ingress router)."""

    router: Literal["tokens", "serve"] = Field("tokens", description="`tokens` or `serve` (Serve's default)")
    stats_period_s: float = Field(
        1.0, gt=0, description="how often each replica reports the tokens it holds (Serve's default: 10)"
    )
    stale_after_s: float = Field(
        5.0, gt=0, description="a report older than this is stale: that replica is routed by ongoing requests"
    )
    ingress_poll_s: float = Field(
        0.2,
        gt=0,
        description="under HAProxy (serve.env): how often the ingress router asks each replica for the tokens it "
        "holds itself, while two or more are up. It sees no request end, and Serve's relay of the replicas' reports "
        "is 1-2 s late",
    )
    prefix_weight: float = Field(
        4.0,
        ge=0,
        description="`tokens`: the prefix score. A prompt token that a replica most likely holds in its prefix cache "
        "(this router sent it the same prefix before) takes this many tokens off that replica's load (a miss costs "
        "its prefill, and where the caches are full it evicts another prompt); 0: none",
    )
    prefix_max_share: float = Field(
        1.0,
        ge=0,
        description="`tokens`: the most the prefix score takes off a replica's load, as a share of its token budget "
        "(so a shared prefix never piles more than that onto one replica; docs/fleet.md: how both were chosen)",
    )
    adapter_weight: float = Field(
        8_000.0,
        ge=0,
        description="`tokens`: the adapter score. What loading a LoRA adapter costs a replica, in tokens: added to "
        "the load of each replica that does not hold the request's adapter, twice where the adapters its engine "
        "holds are as many as it holds at most (a load there evicts another); 0: none (docs/fleet.md: how the "
        "default was chosen)",
    )
    session_affinity: bool = Field(
        True,
        description="`tokens`: a request of a session (the `x-session-id` header, a handle's "
        "`options(session_id=...)`) goes back to the replica its session was last sent to, and a Responses API "
        "request without one that names a `previous_response_id` to the replica that made that response, unless that "
        "replica holds more than `prefix_max_share` of its budget beyond the others (the prefix score's guard); "
        "requests without either are routed as before",
    )

    @model_validator(mode="after")
    def _fresh_enough(self) -> RoutingSettings:
        if self.stale_after_s <= self.stats_period_s:
            raise ValueError(
                f"routing.stale_after_s ({self.stale_after_s}) must be > routing.stats_period_s "
                f"({self.stats_period_s}), or every report would be stale before the next"
            )
        return self
