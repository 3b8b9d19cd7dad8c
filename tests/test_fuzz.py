"""Property-based fuzzing of every HTTP endpoint and handle method (SIMULATED engine, loopback).

Bodies come from hypothesis: well-formed requests with hostile values (huge, negative, NaN, lone
surrogates, wrong types, unknown fields), arbitrary JSON, and bytes that are not JSON at all. The
properties: never a 5xx, never a hang (every call has a deadline), a rejection is a 4xx whose body names
the problem, and a success has the documented shape. Counts land in ``FIGURES``.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import FIGURES, sized

pytestmark = pytest.mark.serve

EXAMPLES = sized(100, 300)
"""Inputs per test: a CI size in ``make test``, the full one in ``make test-soak``."""


def fuzz(examples: int) -> settings:
    """hypothesis's settings for ``examples`` inputs (``FUZZ_EXAMPLES`` in the environment overrides it for a longer
    hunt)."""
    examples = int(os.environ.get("FUZZ_EXAMPLES", examples))
    return settings(
        max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
    )


TRIED: Counter[str] = Counter()

# -- Values: the right types with hostile contents, and the wrong types ---------------------------------

surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=4)
texts = st.one_of(
    st.text(max_size=40),
    st.text(min_size=1, max_size=40).map(lambda t: t * 300),  # long: past the context, past the char limit
    surrogates,  # lone surrogates: valid JSON escapes, unencodable in UTF-8
    st.sampled_from(["", " ", "\x00", "\r\n", "</s>", "<|im_end|>", "{{ x }}", "🦙" * 50, "\u202e"]),
)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
anything = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
sampling = {
    "max_tokens": st.one_of(st.integers(-5, 3000), anything),
    "temperature": st.one_of(st.floats(-1, 3), anything),
    "top_p": st.one_of(st.floats(-0.5, 1.5), anything),
    "stop": st.one_of(st.lists(texts, max_size=5), anything),
    "seed": st.one_of(st.integers(-(2**70), 2**70), anything),
    "top_k": st.one_of(st.integers(-3, 100), anything),
    "min_p": st.one_of(st.floats(-1, 2), anything),
    "repetition_penalty": st.one_of(st.floats(-1, 3), anything),
    "logit_bias": st.one_of(st.dictionaries(st.sampled_from(["1", "50", "x", "-3", "99999999999"]), numbers), anything),
}
openai_fields = {
    "stream": st.one_of(st.booleans(), anything),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), anything),
    "n": st.one_of(st.integers(-1, 20), anything),
    "user": anything,
}


def body_of(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts with any subset of ``fields`` (and sometimes an unknown one)."""
    return st.fixed_dictionaries({}, optional={**fields, "unknown_field": anything})


parts = st.lists(
    st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
        st.fixed_dictionaries({"type": st.sampled_from(["image_url", "input_audio", "text"]), "image_url": anything}),
    ),
    max_size=3,
)
messages = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "x"]), "content": texts}
        ),
        st.fixed_dictionaries({"role": st.just("user"), "content": parts}),
        anything,
    ),
    max_size=4,
)
ENDPOINTS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "/generate": body_of(
        {"prompts": st.one_of(st.lists(texts, max_size=5), anything), "task_id": anything, **sampling}
    ),
    "/v1/completions": body_of(
        {
            "prompt": st.one_of(texts, st.lists(texts, max_size=4), anything),
            "model": st.one_of(st.just("simulated"), texts, anything),
            "echo": anything,
            "logprobs": st.one_of(st.none(), st.integers(-1, 30), anything),
            **openai_fields,
            **sampling,
        }
    ),
    "/v1/chat/completions": body_of(
        {
            "messages": st.one_of(messages, anything),
            "model": st.one_of(texts, anything),
            "max_completion_tokens": st.one_of(st.integers(-5, 3000), anything),
            "logprobs": anything,
            "response_format": st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["text", "json"])}), anything),
            "tools": anything,
            **openai_fields,
            **sampling,
        }
    ),
}


def encode(body: Any) -> bytes:
    """JSON as a client would send it; NaN and infinities go out as the bare tokens Python writes."""
    return json.dumps(body, ensure_ascii=True, allow_nan=True).encode()


def check(response: httpx.Response, where: str) -> None:
    """The properties every answer must have."""
    TRIED[f"{response.status_code}"] += 1
    assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:500]}"
    if response.status_code >= 400:
        body = response.json()
        if "detail" in body:  # Starlette's own answer to an unknown route or method
            assert response.status_code in (404, 405) and body["detail"], response.text
            return
        error = body["error"]  # OpenAI's envelope, on every route of the app
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == response.status_code
        assert isinstance(error["message"], str) and len(error["message"]) > 10, response.text
        if error["message"].startswith("invalid request:"):  # validation errors name the field they are about
            assert error["param"], response.text


@pytest.fixture(scope="module")
def client(serve_instance, deploy_app):
    # Fault injection off: this app is about input handling. A failing engine answers 500 by design, and
    # hypothesis also draws string constants from the code under test, so it can find the markers itself.
    no_faults = {"fail_marker": None, "die_marker": None, "raise_marker": None}
    deploy_app("fuzz", simulated={"max_model_len": 1024, **no_faults}, max_tokens_limit=512)
    with httpx.Client(base_url=serve_instance + "/fuzz", timeout=30) as http:
        yield http
    FIGURES["fuzzing"] = {"inputs": sum(TRIED.values()), **{f"status_{k}": v for k, v in sorted(TRIED.items())}}


@pytest.mark.parametrize("examples", EXAMPLES)
@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_post_endpoints_never_fail_on_any_body(client, path, examples):
    @fuzz(examples)
    @given(body=st.one_of(ENDPOINTS[path], anything))
    def run(body: Any) -> None:
        response = client.post(path, content=encode(body), headers={"content-type": "application/json"})
        check(response, f"POST {path} {encode(body)[:300]!r}")
        if response.status_code == 200:
            if response.headers["content-type"].startswith("text/event-stream"):
                events = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
                assert events[-1] == "[DONE]" and len(events) > 1, response.text[:500]
                assert all("error" not in json.loads(e) for e in events[:-1]), response.text[:500]
                return
            payload = response.json()
            if path == "/generate":
                assert len(payload["results"]) == len(body["prompts"])
                return
            usage = payload["usage"]
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
            # the simulated engine generates max_tokens (>= 1) for every choice
            assert len(payload["choices"]) >= 1 and usage["completion_tokens"] >= len(payload["choices"])
            assert [c["index"] for c in payload["choices"]] == list(range(len(payload["choices"])))

    run()


@pytest.mark.parametrize("examples", EXAMPLES)
def test_raw_bytes_and_wrong_methods_never_fail(client, examples):
    @fuzz(examples)
    @given(
        path=st.sampled_from([*ENDPOINTS, "/stats", "/healthz", "/v1/models", "/nope"]),
        method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
        content=st.binary(max_size=300),
        content_type=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""]),
    )
    def run(path: str, method: str, content: bytes, content_type: str) -> None:
        response = client.request(method, path, content=content, headers={"content-type": content_type})
        TRIED[f"{response.status_code}"] += 1
        assert response.status_code < 500, f"{method} {path} {content[:100]!r}: {response.text[:300]}"

    run()


@pytest.mark.parametrize("examples", EXAMPLES)
def test_get_endpoints_ignore_query_noise(client, examples):
    @fuzz(examples)
    @given(
        path=st.sampled_from(["/stats", "/healthz", "/v1/models"]),
        params=st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=3),
    )
    def run(path: str, params: dict[str, str]) -> None:
        response = client.get(path, params=params)
        check(response, f"GET {path}")
        assert response.status_code == 200

    run()


@pytest.mark.parametrize("examples", EXAMPLES)
def test_handle_methods_raise_value_error_or_answer(serve_instance, client, examples):
    """The Python entry point: a bad argument raises ValueError (never another error); good ones answer."""
    from ray import serve

    handle = serve.get_app_handle("fuzz")

    @settings(fuzz(examples), max_examples=max(1, fuzz(examples).max_examples // 5))
    @given(
        prompts=st.one_of(st.lists(texts, max_size=3), anything),
        options=st.fixed_dictionaries({}, optional=sampling),
    )
    def run(prompts: Any, options: dict[str, Any]) -> None:
        TRIED["handle"] += 1
        try:
            rows = handle.generate_batch.remote(prompts, **options).result(timeout_s=30)
        except ValueError as exc:
            assert str(exc).strip()
            return
        assert len(rows) == len(prompts)
        for row in rows:  # each prompt answered, or refused in its own row (an empty one, say)
            assert row["error"] is None or row["error"].startswith("invalid: "), row
            assert not (isinstance(row["output_tokens"], float) and math.isnan(row["output_tokens"]))

    run()
