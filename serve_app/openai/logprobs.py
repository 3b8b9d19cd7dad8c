"""Log probabilities as the OpenAI routes send them: minus infinity as a number JSON carries, tokens named by id
(vLLM's ``return_tokens_as_token_ids``), and vLLM's ``prompt_logprobs`` field."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..engines import TokenLogprob

LOGPROB_FLOOR = -9999.0
"""What a log probability of minus infinity is sent as (JSON has no infinity; OpenAI's and vLLM's value)."""


def named_by_id(tokens: Sequence[TokenLogprob], by_id: bool = True) -> Sequence[TokenLogprob]:
    """``tokens`` with each token and alternative named ``token_id:<id>`` (vLLM's ``return_tokens_as_token_ids``: a
    token that does not decode alone, such as part of a character's bytes, is still told apart); as they are
    where not ``by_id``."""
    if not by_id:
        return tokens
    return [
        replace(
            t, token=f"token_id:{t.token_id}", top=tuple((f"token_id:{i}", lp) for i, (_, lp) in zip(t.top_ids, t.top))
        )
        for t in tokens
    ]


def vllm_prompt_logprobs(tokens: Sequence[TokenLogprob] | None) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs`` field: for each prompt token (None for the first: nothing precedes it) the token
    and its alternatives by id, each with its ``logprob``, ``rank`` in the vocabulary and ``decoded_token``."""
    return [
        None
        if t.logprob is None
        else {
            str(i): {"logprob": clamp_logprob(logprob), "rank": rank, "decoded_token": text}
            for i, (text, logprob), rank in zip(t.top_ids, t.top, t.top_ranks)
        }
        for t in tokens or ()
    ]


def clamp_logprob(logprob: float | None) -> float:
    """A log probability JSON can carry (:data:`LOGPROB_FLOOR` at least; None, where none was computed, too)."""
    return LOGPROB_FLOOR if logprob is None else max(logprob, LOGPROB_FLOOR)
