"""The replica's batcher, one model per mode (a union on ``mode``): continuous admission for engines that batch
continuously (vLLM), or budgeted batches for static, padded engines. Live-reconfigurable through a
deployment's ``user_config: {batcher: {...}}``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from .common import AutoOrCount, AutoOrPositive, Strict

AUTO_FALLBACK_TOKENS = 65_536
"""The ``auto`` in-flight budget when an engine cannot say how large its KV cache is."""

AUTO_FALLBACK_INFLIGHT = 256
"""The ``auto`` in-flight request cap when an engine cannot say how many requests it runs at once."""

Order = Literal["fifo", "length_aware"]


class QueueSettings(Strict):
    """What both modes have: the bounded queue and the order it is served in."""

    max_queue_size: int = Field(
        4_096, ge=1, description="prompts waiting per replica before new requests get 503 + Retry-After"
    )
    order: Order = Field(
        "fifo",
        description="`fifo`: strictly in arrival order. `length_aware`: continuous mode starts the cheapest request "
        "among the next 64 waiting (shortest first, lower mean latency; one waiting `max_wait_s` goes next); "
        "batch mode cuts each batch from requests of similar length (always with the oldest), so little is padding",
    )


class ContinuousSettings(QueueSettings):
    """Each request enters the engine as soon as its tokens (prompt + max_tokens) fit the in-flight budget, gives
    them back the moment it alone finishes, and streams its output."""

    mode: Literal["continuous"] = Field("continuous", description="`continuous` or `batch`")
    max_inflight_tokens: AutoOrPositive = Field(
        "auto",
        description="token budget in flight (prompt + max_tokens of each request); `auto`: the engine's KV "
        "cache size, read once it is up",
    )
    shared_prefixes: bool = Field(
        True,
        description="a prompt's leading KV-cache blocks that requests in flight hold already count once against "
        "`max_inflight_tokens`, as vLLM's prefix cache holds them once, so requests that share a system prompt or "
        "a conversation's history are not held back for tokens the engine does not spend; false: each request "
        "whole. Generation on an engine with a prefix cache only",
    )
    max_inflight: AutoOrPositive = Field(
        "auto",
        description="most requests inside the engine at once; `auto`: as many as it runs at once (vLLM's "
        "max_num_seqs as `vllm serve` sizes it: 128 on a CPU, 1024 on an H100). Fewer leave it under-filled; more "
        "would wait inside it, out of the batcher's order",
    )
    max_wait_s: float = Field(
        2.0,
        ge=0.0,
        description="order `length_aware`: a request waiting this long goes next; with `lora`, a request whose "
        "adapter must wait is passed by requests of running adapters, and once it has waited this, the running "
        "adapter that leaves soonest takes no more until it has left (`lora.queue_adapters`)",
    )
    peak_estimate: bool = Field(
        False, description="admit on LightLLM's estimate of the peak KV use of what runs instead of final sizes"
    )
    max_queue_wait_s: float | None = Field(
        None,
        gt=0,
        description="503 + Retry-After at once for a request expected to wait longer than this for admission "
        "(from the queue ahead and the recent rate requests leave the engine): load shedding for a latency target",
    )
    low_priority_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="while requests of a higher priority (a smaller number: interactive calls are 0, Ray Data jobs "
        "1) are queued or in flight, or left less than `share_hold_s` ago, lower priorities together hold at most "
        "this share of the in-flight budget and of `max_inflight`, so an interactive request finds room at once; "
        "alone, a batch job fills the engine. 1: no cap",
    )
    low_priority_step_tokens: AutoOrPositive | None = Field(
        "auto",
        description="while the share cap is in force, lower priorities together may also put at most this many tokens "
        "into each of the engine's steps (a request's prompt until its first token, then one a step), so a step an "
        "interactive request waits for stays short where its time grows with its tokens. `auto`: the engine's own "
        "figure (vLLM on a CPU: half its step, 256 of 512 tokens; none on a GPU, whose decode steps barely grow); "
        "null: no step cap",
    )
    share_hold_s: float = Field(
        5.0, ge=0, description="how long the share cap outlasts the last higher-priority request"
    )
    aging_s: float | None = Field(
        30.0,
        gt=0,
        description="a queued request's priority improves by one level for every `aging_s` it waits, so no "
        "priority starves (null: strict priorities)",
    )
    fair_share: bool = Field(
        False,
        description="within a priority, admit from the tenant (the OpenAI `user`, a Ray Data job) that has been "
        "served the fewest tokens (VTC: token-weighted virtual counters); off: arrival order",
    )

    stream_interval_s: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="a streamed request sends at most one chunk this often: tokens the engine makes sooner wait "
        "(at most this long) and go together in the next, while its first token and its end go at once. 0: each "
        "token as soon as the replica takes it (vLLM's server's way); a few tens of ms cut the serving layer's "
        "work per token where the engine makes a stream's tokens faster than that (a GPU). Generation only",
    )

    def batcher_kwargs(
        self, kv_cache_tokens: int | None, max_running: int | None, step_tokens: int | None = None
    ) -> dict[str, Any]:
        """``ContinuousBatcher``'s keywords; the engine's KV cache size, running cap and step figure (its
        ``low_priority_step_tokens()``) resolve ``auto``."""
        budget = self.max_inflight_tokens if self.max_inflight_tokens != "auto" else None
        inflight = self.max_inflight if self.max_inflight != "auto" else None
        step = step_tokens if self.low_priority_step_tokens == "auto" else self.low_priority_step_tokens
        return {
            "max_inflight_cost": budget or kv_cache_tokens or AUTO_FALLBACK_TOKENS,
            "max_inflight": inflight or max_running or AUTO_FALLBACK_INFLIGHT,
            "max_queue_size": self.max_queue_size,
            "order": self.order,
            "max_wait_s": self.max_wait_s,
            "peak_estimate": self.peak_estimate,
            "max_queue_wait_s": self.max_queue_wait_s,
            "low_priority_share": self.low_priority_share,
            "low_priority_step_budget": step,
            "share_hold_s": self.share_hold_s,
            "aging_s": self.aging_s,
            "fair_share": self.fair_share,
            "stream_interval_s": self.stream_interval_s,
        }


class BatchSettings(QueueSettings):
    """Budgeted batches for engines that run static, padded batches: a batch enters the engine whole and ends
    when its longest request does."""

    mode: Literal["batch"] = Field("batch", description="`continuous` or `batch`")
    target_batch_tokens: AutoOrPositive = Field(
        32_768,
        description="token budget of a batch, a ceiling (a lone larger request runs alone): prompt + max_tokens of "
        "each request, or for a padded encoder batch size x its longest input; `auto`: the engine's own figure",
    )
    batch_overhead_tokens: AutoOrCount = Field(
        "auto",
        description="order `length_aware` on a padded engine: what the engine spends on a batch whatever its size, "
        "in tokens; an input joins a batch only if it raises the batch's real tokens over its padded tokens plus "
        "this, so a short queue of scattered lengths gets smaller batches that pad less; `auto`: the engine's own "
        "figure (the padded encoder on a CPU: 128; 0 elsewhere); 0: the budget alone cuts",
    )
    max_batch_size: int = Field(64, ge=1, description="most requests in a batch")
    batch_timeout_s: float = Field(
        0.01, ge=0.0, le=60.0, description="longest the oldest request waits for its batch to fill"
    )
    max_concurrent_batches: int = Field(2, ge=1, description="batches inside the engine at once")
    isolate_failures: bool = Field(
        False, description="when a batch fails, retry its halves so only the requests that fail alone get the error"
    )

    @model_validator(mode="after")
    def _queue_holds_a_batch(self) -> BatchSettings:
        if self.max_queue_size < self.max_batch_size:
            raise ValueError(
                f"batcher.max_queue_size ({self.max_queue_size}) must be >= batcher.max_batch_size "
                f"({self.max_batch_size}), or batches can never fill"
            )
        return self

    def batcher_kwargs(self, auto_tokens: int, padded: bool = False, auto_overhead: int = 0) -> dict[str, Any]:
        """``TokenBatcher``'s keywords; ``auto_tokens`` and ``auto_overhead`` are what the engine says ``auto``
        means for the budget and for ``batch_overhead_tokens``."""
        budget = self.target_batch_tokens if self.target_batch_tokens != "auto" else auto_tokens
        overhead = self.batch_overhead_tokens if self.batch_overhead_tokens != "auto" else auto_overhead
        return {
            "max_queue_size": self.max_queue_size,
            "target_batch_tokens": budget,
            "max_batch_size": self.max_batch_size,
            "batch_timeout_s": self.batch_timeout_s,
            "max_concurrent_batches": self.max_concurrent_batches,
            "length_aware": self.order == "length_aware",
            "isolate_failures": self.isolate_failures,
            "padded": padded,
            "batch_overhead": overhead,
        }


def _mode(value: Any) -> str:
    """The union's tag: ``mode`` where given, else continuous (the default mode)."""
    mode = value.get("mode", "continuous") if isinstance(value, dict) else getattr(value, "mode", "continuous")
    return mode if mode in ("continuous", "batch") else "invalid"


BatcherSettings = Annotated[
    Annotated[ContinuousSettings, Tag("continuous")] | Annotated[BatchSettings, Tag("batch")],
    Discriminator(_mode, custom_error_type="invalid_mode", custom_error_message="mode: must be continuous or batch"),
]
"""The batcher's settings: :class:`ContinuousSettings` or :class:`BatchSettings`, chosen by ``mode``."""
