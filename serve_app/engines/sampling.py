"""Between a request's options and vLLM: its validated :class:`SamplingOptions` as vLLM's ``SamplingParams``,
vLLM's refusal of a request as a :class:`RequestError`, and vLLM's log probabilities as :class:`TokenLogprob`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

from ..errors import RequestError
from .outputs import TokenLogprob
from .requests import SamplingOptions


@contextlib.contextmanager
def vllm_refusals(what: str | None = None) -> Iterator[None]:
    """vLLM's verdict on a request's own fault (``VLLMClientError``: vLLM's server answers it with a 4xx) as a
    :class:`RequestError` naming the field (``what`` where given, else vLLM's ``parameter``)."""
    from vllm.exceptions import VLLMClientError

    try:
        yield
    except VLLMClientError as exc:
        message = exc.args[0] if exc.args else str(exc)
        param = what or getattr(exc, "parameter", None)
        raise RequestError(f"{what}: {message}" if what else message, param=param) from None


def sampling_params(s: SamplingOptions) -> Any:
    """vLLM's ``SamplingParams`` for validated options, streaming deltas."""
    from vllm import SamplingParams
    from vllm.sampling_params import RepetitionDetectionParams, RequestOutputKind, StructuredOutputsParams

    structured = s.structured_outputs
    if structured is not None:
        fields = {**asdict(structured), "choice": list(structured.choice) if structured.choice else None}
        structured = StructuredOutputsParams(**fields)
    repetition = None
    if s.repetition_detection is not None:
        with vllm_refusals("repetition_detection"):  # vLLM's own rules for its three numbers
            repetition = RepetitionDetectionParams(*s.repetition_detection)
    return SamplingParams(
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        min_p=s.min_p,
        frequency_penalty=s.frequency_penalty,
        presence_penalty=s.presence_penalty,
        repetition_penalty=s.repetition_penalty,
        min_tokens=s.min_tokens,
        ignore_eos=s.ignore_eos,
        logit_bias=dict(s.logit_bias) or None,
        stop=list(s.stop) or None,
        stop_token_ids=list(s.stop_token_ids) or None,
        allowed_token_ids=list(s.allowed_token_ids) if s.allowed_token_ids is not None else None,
        bad_words=list(s.bad_words) or None,
        skip_special_tokens=s.skip_special_tokens,
        spaces_between_special_tokens=s.spaces_between_special_tokens,
        include_stop_str_in_output=s.include_stop_str_in_output,
        seed=s.seed,
        logprobs=s.logprobs,
        prompt_logprobs=s.prompt_logprobs,
        structured_outputs=structured,
        output_kind=RequestOutputKind.DELTA,
        stream_interval=s.stream_interval,
        repetition_detection=repetition,
    )


def vllm_logprobs(llm: Any, token_ids: Sequence[int], positions: Sequence[Any] | None) -> tuple[TokenLogprob, ...]:
    """vLLM's log probabilities of ``token_ids`` (one ``{token id: Logprob}`` per position, None where it has none:
    a prompt's first token) as :class:`TokenLogprob`; a token vLLM did not decode is decoded with ``llm``'s
    tokenizer, as vLLM's server does (one token: no need to leave the event loop)."""
    out = []
    for index, token_id in enumerate(token_ids):
        position = positions[index] if positions is not None and index < len(positions) else None
        chosen = position.get(token_id) if position else None
        text = chosen.decoded_token if chosen is not None else None
        if text is None:
            text = llm.get_tokenizer().decode([token_id])
        top = tuple((lp.decoded_token or "", lp.logprob) for lp in position.values()) if position else ()
        ids = tuple(position) if position else ()
        ranks = tuple(lp.rank for lp in position.values()) if position else ()
        out.append(TokenLogprob(text, chosen.logprob if chosen is not None else None, top, token_id, ids, ranks))
    return tuple(out)
