"""A small Ray Data run against the bundled real model: the in-process path (one vLLM engine and one
TokenBatcher in a Ray Data actor of the session's cluster, no Serve app)."""

from __future__ import annotations

import pytest

from serve_app.sample import make

pytestmark = pytest.mark.system


def test_in_process_generate_answers_every_row(serve_instance):
    """Every row answered or, where validation refuses it, an error row; with ``prompt_logprobs`` (a dataset's texts
    scored) every answered row has its prompt's log probabilities in a column of its own."""
    pytest.importorskip("vllm", reason="needs the cpu extra (make setup installs it)")
    import ray.data

    from serve_app.data import InProcessGenerate
    from serve_app.models import prepare

    prepare()
    rows = make(12, seed=1)
    rows[5]["prompt"] = ""  # refused by validation, in its own row
    out = ray.data.from_items(rows).map_batches(
        InProcessGenerate,
        fn_constructor_kwargs={
            "config": {"engine": "vllm", "vllm": {"max_model_len": 1024}},
            "sampling": {"max_tokens": 12, "prompt_logprobs": 0},
        },
        batch_size=4,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=1, max_concurrent_calls_per_actor=3),
        num_cpus=1,
    )
    got = sorted(out.take_all(), key=lambda r: r["id"])
    assert [r["id"] for r in got] == list(range(12))
    assert got[5]["error"] and "empty" in got[5]["error"] and got[5]["prompt_logprobs"] is None
    answered = [r for r in got if r["error"] is None]
    assert len(answered) == 11
    # Every row got a finished generation; a tiny model may end one at once (EOS: one token, no text).
    assert all(r["finish_reason"] in ("stop", "length") for r in answered)
    assert sum(1 for r in answered if r["text"].strip()) >= 8
    assert all(0 < r["output_tokens"] <= 12 for r in answered)
    for row in answered:
        scored = row["prompt_logprobs"]
        assert len(scored) == row["prompt_tokens"] and scored[0]["logprob"] is None
        assert all(t["logprob"] <= 0 and t["token_id"] >= 0 for t in scored[1:])
