"""LoRA adapters: the ``lora`` setting, a request naming an adapter in ``model`` on every door (the SIMULATED
engine, whose answers show the adapter they ran with), ``/v1/models`` listing adapters under their base model,
adapters loaded and unloaded at run time, and the bundled adapter on vLLM's engine (the session's ``real_core``),
whose trained answer the base model never gives."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from serve_app.config import AppConfig, LoraSettings
from serve_app.config.lora import adapter_config
from serve_app.core import Generator
from serve_app.errors import ModelNotFoundError
from serve_app.openai.common import SamplingFields

ADAPTERS = {"answer": "bundled", "legal": "bundled"}
LORA = {"adapters": ADAPTERS}


def adapter_folder(tmp_path: Path, rank: int = 8, modules: Any = ("q_proj",), **more: Any) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    modules = list(modules) if isinstance(modules, tuple) else modules
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": rank, "target_modules": modules, **more}))
    return str(tmp_path)


def test_lora_settings_name_each_bad_value(tmp_path):
    good = LoraSettings(
        adapters={"mine": adapter_folder(tmp_path / "a"), "ours": adapter_folder(tmp_path / "b")}, max_loaded=4
    )
    # every slot asked for, though two are named: adapters loaded at run time need theirs
    assert good.engine_args() == {
        "enable_lora": True,
        "max_loras": 4,
        "max_lora_rank": 16,
        "max_cpu_loras": 4,
        "lora_target_modules": ["q_proj"],
    }
    with pytest.raises(ValidationError, match=r"adapter 'gone': no adapter_config\.json"):
        LoraSettings(adapters={"gone": str(tmp_path / "nothing")})
    with pytest.raises(ValidationError, match="adapter name 'a b'"):
        LoraSettings(adapters={"a b": "bundled"})
    with pytest.raises(ValidationError, match="adapters"):
        LoraSettings(adapters={})
    with pytest.raises(ValidationError, match="max_rank"):
        LoraSettings(adapters=ADAPTERS, max_rank=12)  # not one of vLLM's sizes
    with pytest.raises(ValidationError, match="the base model's name"):
        AppConfig(engine="simulated", lora={"adapters": {"SmolLM2-135M-Instruct": "bundled"}})
    with pytest.raises(ValidationError, match="target_modules"):
        LoraSettings(adapters=ADAPTERS, target_modules=[])


def test_the_engine_applies_lora_to_the_modules_the_adapters_target_alone(tmp_path):
    q, qv = adapter_folder(tmp_path / "q"), adapter_folder(tmp_path / "qv", modules=("v_proj", "q_proj"))
    o = adapter_config(adapter_folder(tmp_path / "o", modules=("o_proj",)))

    def modules(**settings: Any) -> Any:
        return LoraSettings(**settings).engine_args().get("lora_target_modules")

    assert modules(adapters={"q": q, "qv": qv}) == ["q_proj", "v_proj"]  # auto: what the named adapters target
    assert modules(adapters={"q": q}, target_modules=["o_proj", "q_proj"]) == ["o_proj", "q_proj"]
    assert modules(adapters={"q": q}, target_modules="all") is None  # vLLM's default: every module it can
    # a pattern, or whole modules saved, could be any module: every one
    assert modules(adapters={"q": q, "p": adapter_folder(tmp_path / "p", modules="all-linear")}) is None
    assert modules(adapters={"q": q, "s": adapter_folder(tmp_path / "s", modules_to_save=["lm_head"])}) is None
    # an adapter loaded at run time that targets another module would lose it without a word: refused, named
    LoraSettings(adapters={"qv": qv}).check_adapter({"target_modules": ["q_proj"]})
    with pytest.raises(ValueError, match=r"targets o_proj; .* LoRA to q_proj, v_proj alone \(lora.target_modules\)"):
        LoraSettings(adapters={"qv": qv}).check_adapter(o)
    with pytest.raises(ValueError, match="targets a pattern or whole modules"):
        LoraSettings(adapters={"qv": qv}).check_adapter({"target_modules": ".*proj"})
    LoraSettings(adapters={"qv": qv}, target_modules="all").check_adapter(o)
    with pytest.raises(ValidationError, match="adapter 'qv': the adapter targets v_proj"):  # a named one, at once
        LoraSettings(adapters={"q": q, "qv": qv}, target_modules=["q_proj"])


def test_the_vllm_engine_gets_each_adapter_as_a_lora_request_of_its_own(tmp_path):
    pytest.importorskip("vllm", reason="needs the cpu extra (make setup installs it)")
    from serve_app.engines.vllm_engine import lora_requests

    one, two = adapter_folder(tmp_path / "one"), adapter_folder(tmp_path / "two")
    ids = itertools.count(1)
    requests = lora_requests(LoraSettings(adapters={"answer": one, "legal": two}).adapters, ids)
    assert [(r.lora_name, r.lora_int_id, r.lora_path) for r in requests.values()] == [
        ("answer", 1, one),
        ("legal", 2, two),
    ]
    later = lora_requests({"legal": two, "new": one}, ids, requests)  # "answer" unloaded, "new" loaded at run time
    assert [(r.lora_name, r.lora_int_id) for r in later.values()] == [("legal", 2), ("new", 3)]
    again = lora_requests({"answer": one}, ids, later)  # loaded again: a new id, never one used before
    assert later["legal"] is requests["legal"] and again["answer"].lora_int_id == 4


async def test_model_picks_the_adapter_on_every_core_path_and_an_unknown_one_is_named():
    generator = Generator(AppConfig(engine="simulated", lora=LORA))
    await generator.start()
    try:
        builder = generator.requests
        assert builder.adapter(None) is None and builder.adapter("SmolLM2-135M-Instruct") is None
        assert builder.adapter("legal") == "legal"
        with pytest.raises(ModelNotFoundError, match=r"`nope` does not exist; this server serves .*`answer`, `legal`"):
            builder.adapter("nope")
        (request,) = await builder.prompts(["hello"], builder.sampling(SamplingFields(model="answer", max_tokens=2)))
        assert request.sampling.adapter == "answer"
        (result,) = await generator.complete([request])
        assert result.text.startswith("[simulated answer] hello")
        rows = await generator.rows(["a", "b"], {"model": "legal", "max_tokens": 1})  # what a Ray Data job runs
        assert [row["text"] for row in rows] == ["[simulated legal] a", "[simulated legal] b"]
        with pytest.raises(ModelNotFoundError, match="`nope` does not exist"):  # the job's own setting: at once
            await generator.rows(["a"], {"model": "nope"})
    finally:
        await generator.stop()


@pytest.fixture(scope="module")
def lora_app(serve_instance, deploy_app):
    """A SIMULATED app serving :data:`LORA`'s adapters: its base URL and handle."""
    return serve_instance + "/lora", deploy_app("lora", lora=LORA, simulated={"step_s": 0.001})


@pytest.mark.serve
async def test_every_http_route_and_handles_answer_with_the_adapter_named_in_model(lora_app):
    base, handle = lora_app
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        models = (await http.get("/v1/models")).json()["data"]
        assert [(m["id"], m["parent"]) for m in models] == [
            ("SmolLM2-135M-Instruct", None),
            ("answer", "SmolLM2-135M-Instruct"),
            ("legal", "SmolLM2-135M-Instruct"),
        ]
        completion = await http.post("/v1/completions", json={"model": "answer", "prompt": "hi", "max_tokens": 2})
        assert completion.json()["model"] == "answer"
        assert completion.json()["choices"][0]["text"] == "[simulated answer] hi hi"
        chat = {"model": "legal", "messages": [{"role": "user", "content": "yo"}], "max_tokens": 1, "stream": True}
        async with http.stream("POST", "/v1/chat/completions", json=chat) as stream:
            events = [json.loads(line[6:]) async for line in stream.aiter_lines() if line.startswith("data: {")]
        assert {event["model"] for event in events} == {"legal"}
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]).startswith(
            "[simulated legal]"
        )
        generated = await http.post("/generate", json={"model": "legal", "prompts": ["x"], "max_tokens": 1})
        assert generated.json()["results"] == ["[simulated legal] x"]
        missing = await http.post("/v1/completions", json={"model": "nope", "prompt": "hi"})
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
        assert "`nope` does not exist" in missing.json()["error"]["message"]
        assert "`answer`, `legal`" in missing.json()["error"]["message"]
    assert (await handle.generate.remote("h", model="answer", max_tokens=1))["text"] == "[simulated answer] h"
    with pytest.raises(ValueError, match="`nope` does not exist"):
        await handle.generate.remote("h", model="nope")


@pytest.mark.serve
async def test_adapters_load_and_unload_at_run_time_as_vllms_server_does(lora_app, scripted_app, tmp_path):
    base, _ = lora_app
    fresh, wide = adapter_folder(tmp_path / "fresh"), adapter_folder(tmp_path / "wide", rank=32)
    mlp = adapter_folder(tmp_path / "mlp", modules=("q_proj", "up_proj"))
    ask = {"model": "fresh", "prompt": "hi", "max_tokens": 1}
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        assert (await http.post("/v1/completions", json=ask)).status_code == 404
        loaded = await http.post("/v1/load_lora_adapter", json={"lora_name": "fresh", "lora_path": fresh})
        assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'fresh' added successfully."
        assert (await http.post("/v1/completions", json=ask)).json()["choices"][0]["text"] == "[simulated fresh] hi"
        models = {m["id"]: m for m in (await http.get("/v1/models")).json()["data"]}
        assert models["fresh"]["root"] == fresh and models["fresh"]["parent"] == "SmolLM2-135M-Instruct"
        for body, param, words in [
            ({"lora_name": "fresh", "lora_path": fresh}, "lora_name", "has already been loaded"),
            ({"lora_name": "answer", "lora_path": fresh}, "lora_name", "has already been loaded"),
            ({"lora_name": "wide", "lora_path": wide}, "lora_path", "rank 32 is above lora.max_rank (16)"),
            ({"lora_name": "gone", "lora_path": str(tmp_path / "nothing")}, "lora_path", "no LoRA adapter in"),
            ({"lora_name": "a b", "lora_path": fresh}, "lora_name", "letters, digits"),
            ({"lora_name": "mlp", "lora_path": mlp}, "lora_path", "targets up_proj; this app's engine applies LoRA"),
        ]:
            refused = await http.post("/v1/load_lora_adapter", json=body)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
            assert words in refused.json()["error"]["message"]
        static = await http.post("/v1/unload_lora_adapter", json={"lora_name": "answer"})
        assert static.status_code == 400 and "cannot be unloaded" in static.json()["error"]["message"]
        unloaded = await http.post("/v1/unload_lora_adapter", json={"lora_name": "fresh"})
        assert unloaded.status_code == 200 and unloaded.text == "Success: LoRA adapter 'fresh' removed successfully."
        assert (await http.post("/v1/completions", json=ask)).status_code == 404
        again = await http.post("/v1/unload_lora_adapter", json={"lora_name": "fresh"})
        assert again.status_code == 404 and "cannot be found" in again.json()["error"]["message"]
    without, _ = scripted_app  # an app without the lora setting
    async with httpx.AsyncClient(base_url=without, timeout=60) as http:
        refused = await http.post("/v1/load_lora_adapter", json={"lora_name": "fresh", "lora_path": fresh})
        assert refused.status_code == 400 and "set `lora`" in refused.json()["error"]["message"]


@pytest.mark.system
def test_the_bundled_adapter_answers_as_trained_on_vllms_engine_and_the_base_model_does_not(real_core, engine_loop):
    from serve_app.adapters import ADAPTER_REPLY, BUNDLED_ADAPTER, adapter_path, questions
    from serve_app.openai.chat import ChatCompletionRequest

    async def answers(model: str | None) -> list[str]:
        requests = []
        for question in questions(3, seed=7):  # not what it was trained on
            body = ChatCompletionRequest(model=model, messages=[{"role": "user", "content": question}], max_tokens=8)
            requests += await real_core.requests.chat_completion(body)
        return [result.text for result in await real_core.complete(requests)]

    adapted = engine_loop.run_until_complete(answers(BUNDLED_ADAPTER))
    assert all(text.startswith(ADAPTER_REPLY) for text in adapted), adapted
    base = engine_loop.run_until_complete(answers(None))
    assert not any(text.startswith("ANSWER") for text in base), base
    # loaded at run time under another name, then unloaded: vLLM's engine adds it with its first request, then
    # removes it
    held = engine_loop.run_until_complete(real_core.engine.loaded_adapters())
    assert held == [BUNDLED_ADAPTER]  # what the replica reports to the router's adapter score: vLLM's own list
    assert real_core.engine.adapter_slots == 2  # and how many it holds at most: its CPU cache, max_loaded (default 2)
    # LoRA's kernels on the modules the adapter trained alone (`target_modules: auto`)
    assert real_core.engine._llm.vllm_config.lora_config.target_modules == ["q_proj", "v_proj"]
    engine_loop.run_until_complete(real_core.set_runtime_adapters({"again": str(adapter_path())}))
    try:
        assert all(text.startswith(ADAPTER_REPLY) for text in engine_loop.run_until_complete(answers("again")))
        assert "again" in engine_loop.run_until_complete(real_core.engine.loaded_adapters())
    finally:
        engine_loop.run_until_complete(real_core.set_runtime_adapters({}))
    with pytest.raises(ModelNotFoundError, match="`again` does not exist"):
        engine_loop.run_until_complete(answers("again"))
    assert set(engine_loop.run_until_complete(real_core.engine._llm.list_loras())) <= {1}  # the setting's alone
