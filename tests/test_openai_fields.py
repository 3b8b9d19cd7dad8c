"""The OpenAI request bodies against the shapes they follow: every field of OpenAI's current request types is known;
every field of vLLM's server's request models is known, either implemented or listed as an extension refused
unless it carries vLLM's default; a field neither defines is ignored and logged once, as vLLM's server does."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from openai.types import completion_create_params, embedding_create_params
from openai.types.chat import completion_create_params as chat_create_params
from openai.types.responses import response_create_params

from serve_app.openai.chat import ChatCompletionRequest
from serve_app.openai.completions import CompletionRequest
from serve_app.openai.embeddings import EmbeddingRequestBody
from serve_app.openai.fields import OpenAIModel
from serve_app.openai.responses import ResponsesRequest
from serve_app.openai.tokenize import DetokenizeRequest, TokenizeRequest

OURS_AND_OPENAIS = [
    (ChatCompletionRequest, chat_create_params.CompletionCreateParamsBase),
    (CompletionRequest, completion_create_params.CompletionCreateParamsBase),
    (EmbeddingRequestBody, embedding_create_params.EmbeddingCreateParams),
    (ResponsesRequest, response_create_params.ResponseCreateParamsBase),
]


def typed_dict_keys(shape: type) -> set[str]:
    return {key for cls in shape.__mro__ for key in getattr(cls, "__annotations__", {})}


@pytest.mark.parametrize(("ours", "openais"), OURS_AND_OPENAIS, ids=lambda v: getattr(v, "__name__", ""))
def test_every_field_of_openais_request_types_is_known(ours: type[OpenAIModel], openais: type) -> None:
    assert not typed_dict_keys(openais) - set(ours.model_fields), f"{ours.__name__} lacks OpenAI's fields"


def vllms_models() -> list[tuple[type[OpenAIModel], Any]]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChat
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VllmCompletion
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest
    from vllm.entrypoints.serve.tokenize import protocol as tokenize

    return [
        (ChatCompletionRequest, VllmChat),
        (CompletionRequest, VllmCompletion),
        (EmbeddingRequestBody, EmbeddingCompletionRequest),
        (TokenizeRequest, tokenize.TokenizeCompletionRequest),
        (TokenizeRequest, tokenize.TokenizeChatRequest),
        (DetokenizeRequest, tokenize.DetokenizeRequest),
    ]


def test_every_field_of_vllms_request_models_is_ours_or_a_refused_extension_with_vllms_default() -> None:
    models = vllms_models()
    for ours, vllms in models:
        missing = set(vllms.model_fields) - ours.known_fields()
        assert not missing, f"{ours.__name__} does not know vLLM's {sorted(missing)} ({vllms.__name__})"
        for name, default in ours.VLLM_EXTENSIONS.items():
            if name in vllms.model_fields:
                assert vllms.model_fields[name].get_default(call_default_factory=True) == default, (ours, name)
        stale = [name for name in ours.VLLM_EXTENSIONS if not any(name in v.model_fields for _, v in models)]
        assert not stale, f"{ours.__name__} lists extensions vLLM no longer has: {stale}"


def test_unknown_fields_are_ignored_and_logged_once_per_field(caplog: pytest.LogCaptureFixture) -> None:
    body = {
        "messages": [{"role": "assistant", "content": "hi", "field_of_2027": 1}],
        "field_of_2027": {"x": 1},
        "stream": True,
        "stream_options": {"include_usage": True, "field_of_2027": True},
    }
    with caplog.at_level(logging.WARNING, logger="serve_app.openai.fields"):
        for _ in range(3):
            request = ChatCompletionRequest.model_validate(body)
            assert request.refusals() == [] and request.include_usage
    ignored = [r.getMessage() for r in caplog.records if "field_of_2027" in r.getMessage()]
    assert len(ignored) == 3, ignored  # once for each model that saw it, not once per request
    assert {m.split(":")[0] for m in ignored} == {"ChatCompletionRequest", "ChatMessage", "StreamOptions"}


@pytest.mark.parametrize(
    ("model", "body", "refused"),
    [
        (CompletionRequest, {"prompt": "hi", "add_special_tokens": True, "bad_words": []}, []),
        (CompletionRequest, {"prompt": "hi", "return_token_offsets": True}, ["return_token_offsets"]),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}], "echo": True}, ["echo"]),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}], "vllm_xargs": {}}, ["vllm_xargs"]),
        (EmbeddingRequestBody, {"input": "hi", "priority": 0, "endianness": "native"}, []),
        (EmbeddingRequestBody, {"input": "hi", "priority": 3}, ["priority"]),
        (TokenizeRequest, {"prompt": "hi", "chat_template": "{{ messages }}"}, ["chat_template"]),
    ],
)
def test_vllms_extensions_this_server_lacks_are_refused_unless_at_vllms_default(model, body, refused) -> None:
    request = model.model_validate(body)
    found = request.refusals(384) if model is EmbeddingRequestBody else request.refusals()
    assert [field for field, _ in found] == refused
    assert all("vLLM extension is not supported" in why for _, why in found)


def test_usage_reports_the_prompt_tokens_the_prefix_cache_held_where_the_engine_keeps_one():
    """OpenAI's ``prompt_tokens_details.cached_tokens`` (vLLM's server: with ``--enable-prompt-tokens-details``),
    each prompt counted once however many choices it has; nothing where the engine keeps no prefix cache."""
    from serve_app.engines import GenerationResult
    from serve_app.openai.common import usage

    def result(cached: int | None) -> GenerationResult:
        return GenerationResult("r", "x", 40, 2, "stop", cached_tokens=cached)

    assert usage([result(32), result(32), result(16), result(16)], n=2).prompt_tokens_details.cached_tokens == 48
    assert usage([result(None)]).prompt_tokens_details is None
    assert "cached_tokens" not in result(32).to_dict()  # /generate's details are as before


def test_vllms_detokenizing_fields_reach_the_engines_sampling_params():
    """``skip_special_tokens`` and ``spaces_between_special_tokens`` (vLLM's), from a body to vLLM's
    ``SamplingParams`` (for the bundled model's tokenizer the spaces change nothing: vLLM's detokenizer of a fast
    tokenizer adds none between its special tokens either way)."""
    pytest.importorskip("vllm")
    from dataclasses import fields as dataclass_fields

    from serve_app.engines import SamplingOptions
    from serve_app.engines.sampling import sampling_params

    body = CompletionRequest(prompt="x", skip_special_tokens=False, spaces_between_special_tokens=False)
    given = body.model_dump(include={"skip_special_tokens", "spaces_between_special_tokens"})
    assert {f.name for f in dataclass_fields(SamplingOptions)} >= given.keys()
    params = sampling_params(SamplingOptions(max_tokens=4, **given))
    assert params.skip_special_tokens is False and params.spaces_between_special_tokens is False
    assert sampling_params(SamplingOptions(max_tokens=4)).spaces_between_special_tokens is True
