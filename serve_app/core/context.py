"""A tokenized prompt fitted to the model's context as vLLM's server fits it: cut to the request's
``truncate_prompt_tokens`` from its side, refused where it fills the context, its ``max_tokens`` cut to the room
the prompt leaves."""

from __future__ import annotations

from dataclasses import replace

from ..engines import SamplingOptions
from ..errors import RequestError


def truncated(token_ids: list[int], sampling: SamplingOptions, context: int, side: str, what: str) -> list[int]:
    """The prompt's tokens cut to ``truncate_prompt_tokens`` from the request's side (else ``side``, the engine's
    tokenizer's), as vLLM's renderer cuts them (-1: the context less the one token an answer needs)."""
    keep = sampling.truncate_prompt_tokens
    if keep is None:
        return token_ids
    if keep > context:
        why = f"truncate_prompt_tokens={keep} cannot be greater than the model's context of {context} tokens"
        raise RequestError(why, param="truncate_prompt_tokens")
    keep = context - 1 if keep < 0 else keep
    if keep == 0:
        raise RequestError(f"{what} is empty with truncate_prompt_tokens=0", param="truncate_prompt_tokens")
    return token_ids[-keep:] if (sampling.truncation_side or side) == "left" else token_ids[:keep]


def fitted(token_ids: list[int], sampling: SamplingOptions, context: int, what: str) -> SamplingOptions:
    """``sampling`` with its ``max_tokens`` cut to the room ``token_ids`` leave in the context, as vLLM's server
    answers it; a prompt that fills the context, or a ``min_tokens`` past the room, is refused."""
    if len(token_ids) >= context:
        raise RequestError(f"{what} has {len(token_ids)} tokens; the model's context is {context} tokens")
    room = context - len(token_ids)
    if sampling.min_tokens > room:
        why = f"{what} has {len(token_ids)} tokens: the model's context of {context} leaves room for {room}"
        raise RequestError(f"{why}, fewer than min_tokens={sampling.min_tokens}", param="min_tokens")
    return replace(sampling, max_tokens=room) if sampling.max_tokens > room else sampling
