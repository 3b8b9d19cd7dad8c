"""What an engine gives back for a request: its text deltas as they come, then its result (token counts, finish
reason, log probabilities where asked for); how far along a request is, and two deltas joined as one."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .requests import GenerationRequest


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log probability as the engine computed it: the token's text, its ``logprob`` (None where the
    engine computes none: a prompt's first token), and the alternatives it returned at that position as ``(text,
    logprob)`` pairs in its own order (vLLM's: the token itself, then the most likely, without repeats); the
    token's id, and the alternatives' ids and ranks in the vocabulary (``top_ids``, ``top_ranks``, in ``top``'s
    order) where the engine gives them."""

    token: str
    logprob: float | None
    top: tuple[tuple[str, float], ...] = ()
    token_id: int | None = None
    top_ids: tuple[int, ...] = ()
    top_ranks: tuple[int | None, ...] = ()


Logprobs = tuple[TokenLogprob, ...]


@dataclass
class GenerationDelta:
    """New output of a running request: ``text`` since the previous delta; ``output_tokens`` so far; where asked
    for (``SamplingOptions.logprobs``), the new tokens' ``logprobs``, and on the first delta the
    ``prompt_logprobs``; the new tokens' ids (``token_ids``: what vLLM's ``return_token_ids`` sends)."""

    request_id: str
    text: str
    output_tokens: int
    logprobs: Logprobs | None = None
    prompt_logprobs: Logprobs | None = None
    token_ids: tuple[int, ...] = ()


@dataclass
class GenerationResult:
    """One prompt's outcome; ``error`` is set (and ``finish_reason`` is "error") when it failed alone: the engine
    failed it, or ended it before its caller was done with it (vLLM's "abort")."""

    request_id: str
    text: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    error: str | None = None
    logprobs: Logprobs | None = None
    """Every generated token's, where asked for (``SamplingOptions.logprobs``)."""
    prompt_logprobs: Logprobs | None = None
    """Every prompt token's, where asked for (``SamplingOptions.prompt_logprobs``)."""
    token_ids: tuple[int, ...] = ()
    """Every generated token's id, in order (what vLLM's ``return_token_ids`` sends)."""
    cached_tokens: int | None = None
    """How many of the prompt's tokens the engine found in its prefix cache (vLLM's ``num_cached_tokens``); None
    where the engine keeps no such cache."""
    cache_write_tokens: int | None = None
    """How many of the prompt's tokens this request computed into new prefix-cache blocks (vLLM's
    ``num_cache_creation_tokens``: its full blocks not cached before); None where the engine keeps no such cache."""
    stop_reason: int | str | None = None
    """The stop string or stop token id that ended it (vLLM's ``stop_reason``); None: its end-of-sequence token,
    its length, or an engine that does not say."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the log probabilities only where asked for; the token ids, the prefix cache's counts
        and the stop reason left to the routes that report them)."""
        out = asdict(self)
        del out["token_ids"], out["cached_tokens"], out["cache_write_tokens"], out["stop_reason"]
        for name in ("logprobs", "prompt_logprobs"):
            if out[name] is None:
                del out[name]
        return out

    @property
    def failed(self) -> bool:
        """Whether the prompt failed (its ``error`` says why)."""
        return self.error is not None

    @classmethod
    def failure(cls, request: GenerationRequest, error: str, output_tokens: int = 0) -> GenerationResult:
        """The result of ``request`` when it failed with ``error``."""
        return cls(request.request_id, "", len(request.prompt_token_ids), output_tokens, "error", error=error)


GenerationOutput = GenerationDelta | GenerationResult
"""What an engine stream yields: deltas, then exactly one final :class:`GenerationResult`."""


def progress(output: GenerationOutput) -> int:
    """Tokens a request has generated so far, from any of its outputs (the batcher's ``progress_fn``)."""
    return output.output_tokens


def coalesce(earlier: GenerationOutput, later: GenerationOutput) -> GenerationDelta | None:
    """Two deltas of one request as one, for a reader that fell behind (the batcher's ``coalesce_fn``); a result
    stays apart."""
    if earlier.__class__ is not GenerationDelta or later.__class__ is not GenerationDelta:
        return None
    logprobs = earlier.logprobs
    if later.logprobs is not None:
        logprobs = (*(logprobs or ()), *later.logprobs)
    return GenerationDelta(
        earlier.request_id,
        earlier.text + later.text,
        later.output_tokens,
        logprobs,
        earlier.prompt_logprobs or later.prompt_logprobs,
        earlier.token_ids + later.token_ids,
    )
