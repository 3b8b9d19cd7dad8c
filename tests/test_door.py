"""The door (serve_app/door.py): the optional API key and the request-body limit.

First the middleware alone, on bare ASGI and FastAPI apps (no Ray: fast); then through HTTP against local
Serve apps with the SIMULATED engine: without a key nothing changes; with one (in the config, or in the
replica's environment) every route but the health checks answers 401 without it, the OpenAI client with
``api_key=`` works, streaming too, and handle calls need none; bodies over the limit get 413 before they
are parsed (by Content-Length, or counted when chunked), and malformed framing gets 400.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from pydantic import ValidationError

from serve_app.config import API_KEY_ENV, DEFAULT_MAX_REQUEST_BODY_BYTES, AppConfig, DeploymentConfig, EmbeddingConfig
from serve_app.serving import door

KEY = "sk-test-0123456789abcdef"
LIMIT = 4096
MODEL = "SmolLM2-135M-Instruct"
serve_test = pytest.mark.serve


# -- The configuration ---------------------------------------------------------------------------


def test_config_defaults_no_key_and_16_mib_and_the_key_never_shows():
    config = AppConfig()
    assert config.api_key is None and config.max_request_body_bytes == DEFAULT_MAX_REQUEST_BODY_BYTES == 16 << 20
    keyed = AppConfig(api_key=KEY)
    assert KEY not in repr(keyed) and KEY not in str(keyed.model_dump()) and KEY not in keyed.model_dump_json()
    assert AppConfig.model_validate(keyed.model_dump()).api_key.get_secret_value() == KEY  # survives build_app
    assert issubclass(AppConfig, DeploymentConfig) and issubclass(EmbeddingConfig, DeploymentConfig)


def test_the_config_key_wins_over_the_environment_variable():
    env = {API_KEY_ENV: "from-env"}
    assert DeploymentConfig(api_key="from-config").effective_api_key(env).get_secret_value() == "from-config"
    assert DeploymentConfig().effective_api_key(env).get_secret_value() == "from-env"
    assert DeploymentConfig().effective_api_key({}) is None
    assert DeploymentConfig().effective_api_key({API_KEY_ENV: ""}) is None  # empty: unset


@pytest.mark.parametrize("bad", ["", "two words", "tab\there", "caf\u00e9", "line\nbreak"])
def test_keys_no_client_could_send_are_refused(bad):
    with pytest.raises(ValidationError, match="api_key"):
        DeploymentConfig(api_key=bad)
    if bad:
        with pytest.raises(ValueError, match=API_KEY_ENV):
            DeploymentConfig().effective_api_key({API_KEY_ENV: bad})


def test_a_tiny_body_limit_is_refused():
    with pytest.raises(ValidationError, match="max_request_body_bytes"):
        DeploymentConfig(max_request_body_bytes=16)


# -- The middleware on a bare ASGI app -----------------------------------------------------------


class Recorder:
    """A bare ASGI app: reads the whole body, answers 200 with its size; or streams three chunks."""

    def __init__(self, stream: bool = False) -> None:
        self.calls = 0
        self.stream = stream

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.calls += 1
        if self.stream:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for i in range(3):
                await send({"type": "http.response.body", "body": f"data: {i}\n\n".encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                await send({"type": "http.response.start", "status": 400, "headers": []})
                await send({"type": "http.response.body", "body": b"client gone"})
                return
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(size).encode()})


def armed(app: Any, api_key: str | None = KEY, limit: int = LIMIT) -> door.Door:
    """A door in front of ``app``, configured as a replica would."""
    holder = FastAPI()
    door.install(holder)
    door.configure(holder, DeploymentConfig(api_key=api_key, max_request_body_bytes=limit))
    return door.Door(app, key=holder.state.door_key)


async def call(
    app: Any,
    path: str = "/v1/completions",
    headers: list[tuple[bytes, bytes]] = (),
    chunks: list[bytes] = (b"",),
    method: str = "POST",
    root_path: str = "",
) -> tuple[int | None, dict[bytes, bytes], bytes, list[dict[str, Any]]]:
    """Drive ``app`` with one request; its status, headers, body, and every message it sent."""
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": root_path + path,
        "root_path": root_path,
        "headers": list(headers),
    }
    await app(scope, receive, send)
    start = next((m for m in sent if m["type"] == "http.response.start"), {})
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start.get("status"), dict(start.get("headers", [])), body, sent


def bearer(key: str = KEY) -> tuple[bytes, bytes]:
    return (b"authorization", f"Bearer {key}".encode())


def envelope(body: bytes, status: int) -> dict[str, Any]:
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    return error


async def test_unit_the_key_is_checked_before_the_app_runs():
    app = Recorder()
    gate = armed(app)
    for headers in ([], [bearer("wrong")], [(b"authorization", KEY.encode())], [(b"authorization", b"Bearer")]):
        status, out, body, _ = await call(gate, headers=headers)
        assert status == 401 and out[b"www-authenticate"] == b"Bearer"
        assert envelope(body, 401)["type"] == "AuthenticationError"
    status, *_ = await call(gate, headers=[bearer(), bearer()])  # two Authorization headers: ambiguous
    assert status == 401 and app.calls == 0
    assert (await call(gate, headers=[bearer()], chunks=[b"abc"]))[:3:2] == (200, b"3")
    assert (await call(gate, headers=[(b"authorization", f"bearer  {KEY}".encode())]))[0] == 200  # scheme: any case
    for path in ("/health", "/healthz", "/ping", "/version"):
        assert (await call(gate, path=path, method="GET"))[0] == 200
        assert (await call(gate, path=path, method="GET", root_path="/llm"))[0] == 200  # under a route prefix
    for path in ("/health/", "//health", "/healthzz", "/llm/health"):  # only the exact paths are open
        assert (await call(gate, path=path, method="GET"))[0] == 401


async def test_unit_no_key_lets_everything_through():
    app = Recorder()
    gate = armed(app, api_key=None)
    assert (await call(gate))[0] == 200
    assert (await call(gate, headers=[bearer("anything")]))[0] == 200  # clients that always send one
    assert app.calls == 2


async def test_unit_bodies_over_the_limit_get_413_by_content_length_without_reaching_the_app():
    app = Recorder()
    gate = armed(app, api_key=None)
    at = await call(gate, headers=[(b"content-length", str(LIMIT).encode())], chunks=[b"x" * LIMIT])
    assert at[:3:2] == (200, str(LIMIT).encode())
    for length in (LIMIT + 1, 10**12, 10**40):  # a huge header is refused at once (the body is never read)
        status, out, body, _ = await call(gate, headers=[(b"content-length", str(length).encode())], chunks=[b"x"])
        assert status == 413 and out[b"connection"] == b"close"
        assert "4096 bytes" in envelope(body, 413)["message"]
    assert app.calls == 1


@pytest.mark.parametrize(
    "headers",
    [
        [(b"content-length", b"abc")],
        [(b"content-length", b"-1")],
        [(b"content-length", b"+5")],
        [(b"content-length", b"1_0")],
        [(b"content-length", b"5, 5")],
        [(b"content-length", b"5"), (b"content-length", b"6")],
        [(b"content-length", b"5"), (b"transfer-encoding", b"chunked")],
    ],
)
async def test_unit_malformed_content_length_gets_400(headers):
    app = Recorder()
    status, _, body, _ = await call(armed(app), headers=[bearer(), *headers], chunks=[b"12345"])
    assert status == 400 and "Content-Length" in envelope(body, 400)["message"]
    assert app.calls == 0


async def test_unit_chunked_bodies_are_counted_and_stopped_at_the_limit():
    app = Recorder()
    gate = armed(app, api_key=None)
    chunked = [(b"transfer-encoding", b"chunked")]
    status, _, body, _ = await call(gate, headers=chunked, chunks=[b"x" * 1024] * 4)  # exactly the limit
    assert (status, body) == (200, b"4096")
    status, out, body, sent = await call(gate, headers=chunked, chunks=[b"x" * 1024] * 4 + [b"x"] + [b"y"] * 10)
    assert status == 413 and out[b"connection"] == b"close" and envelope(body, 413)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]  # the app's 400 dropped


async def test_unit_chunked_overflow_through_fastapi_is_413_not_fastapis_400():
    api = FastAPI()
    door.install(api)
    door.configure(api, DeploymentConfig(max_request_body_bytes=LIMIT))
    seen: list[int] = []

    @api.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        seen.append(len(await request.body()))
        return {"size": seen[-1]}

    async def body(size: int) -> AsyncIterator[bytes]:
        for _ in range(size // 512):
            yield b"z" * 512

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://app") as client:
        small = await client.post("/echo", content=body(LIMIT))
        big = await client.post("/echo", content=body(3 * LIMIT))
        fixed = await client.post("/echo", content=b"z" * (LIMIT + 1))
    assert small.status_code == 200 and small.json() == {"size": LIMIT}
    assert big.status_code == 413 and envelope(big.content, 413)
    assert fixed.status_code == 413
    assert seen == [LIMIT]


async def test_unit_streamed_responses_pass_through_untouched():
    for headers in ([bearer()], [bearer(), (b"transfer-encoding", b"chunked")]):  # unwrapped, then counted
        _, _, body, sent = await call(armed(Recorder(stream=True)), headers=headers)
        assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert [m.get("more_body", False) for m in sent[1:]] == [True, True, True, False]  # chunk by chunk


async def test_unit_an_unconfigured_door_fails_closed():
    api = FastAPI()
    door.install(api)
    app = Recorder()
    status, out, body, _ = await call(door.Door(app, key=api.state.door_key))
    assert status == 503 and out[b"retry-after"] == b"1" and envelope(body, 503)
    assert app.calls == 0
    with pytest.raises(RuntimeError, match="install"):
        door.configure(FastAPI(), DeploymentConfig())  # configure without install
    with pytest.raises(RuntimeError, match="already"):
        door.install(api)


async def test_unit_lifespan_and_websockets():
    app = Recorder()
    gate = armed(app)
    lifespan: list[str] = []

    async def lifespan_app(scope, receive, send):
        lifespan.append(scope["type"])

    await armed(lifespan_app)({"type": "lifespan"}, None, None)
    assert lifespan == ["lifespan"]
    sent: list[dict[str, Any]] = []

    async def send(message):
        sent.append(message)

    await gate({"type": "websocket", "path": "/ws", "headers": []}, None, send)
    assert sent[0]["type"] == "websocket.close" and sent[0]["code"] == 1008 and app.calls == 0


# -- Through HTTP against local Serve apps -------------------------------------------------------


@pytest.fixture(scope="module")
def open_app(serve_instance, deploy_app):
    """No key configured (as before): everything answers without one."""
    handle = deploy_app("door-open", max_request_body_bytes=LIMIT, sampling={"max_tokens": 4})
    return serve_instance + "/door-open", handle


@pytest.fixture(scope="module")
def keyed_app(serve_instance, deploy_app):
    handle = deploy_app(
        "door-key", api_key=KEY, max_request_body_bytes=LIMIT, simulated={"step_s": 0.002}, sampling={"max_tokens": 4}
    )
    return serve_instance + "/door-key", handle


@pytest.fixture(scope="module")
def env_app(serve_instance):
    """The key from SERVE_APP_API_KEY in the replica's environment, none in the config."""
    from ray import serve

    from serve_app.app import deployment_options
    from serve_app.serving.llm import LLMServer
    from tests.conftest import SIMULATED_DEFAULTS

    config = AppConfig.model_validate(SIMULATED_DEFAULTS)
    options = deployment_options(config)
    options["ray_actor_options"]["runtime_env"] = {"env_vars": {API_KEY_ENV: "sk-from-the-environment"}}
    handle = serve.run(
        LLMServer.options(**options).bind(config.model_dump()), name="door-env", route_prefix="/door-env"
    )
    yield serve_instance + "/door-env", handle
    serve.delete("door-env", _blocking=False)


def protected_routes() -> list[tuple[str, str]]:
    """Every (method, path) the LLM app serves but the health checks: a route added later is covered too."""
    from serve_app.serving.llm import api

    routes = [
        (method, route.path)
        for route in api.routes
        for method in sorted(getattr(route, "methods", None) or ())
        if route.path not in door.PUBLIC_PATHS
    ]
    assert {("POST", "/generate"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")} <= set(routes)
    assert {("GET", "/v1/models"), ("GET", "/stats"), ("GET", "/openapi.json")} <= set(routes)
    return routes


async def raw_http(url: str, head: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request written byte for byte on a socket (httpx will not send a lying Content-Length)."""
    target = httpx.URL(url)
    reader, writer = await asyncio.open_connection(target.host, target.port)
    try:
        writer.write(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        await writer.drain()
        raw_head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        status_line, *lines = raw_head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}
        length = int(headers.get("content-length", 0))
        return int(status_line.split()[1]), headers, await asyncio.wait_for(reader.readexactly(length), 30)
    finally:
        writer.close()


def generate_body(size: int) -> bytes:
    """A valid /generate body of exactly ``size`` bytes."""
    shell = json.dumps({"prompts": [""], "max_tokens": 2}).encode()
    body = json.dumps({"prompts": ["p" * (size - len(shell))], "max_tokens": 2}).encode()
    assert len(body) == size
    return body


@serve_test
async def test_without_a_key_everything_works_as_before(open_app):
    url, handle = open_app
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for headers in ({}, {"Authorization": "Bearer unused"}):  # OpenAI clients always send one
            generate = await http.post("/generate", json={"prompts": ["a b"]}, headers=headers)
            assert generate.status_code == 200, generate.text
            for path in ("/v1/models", "/stats", "/health", "/healthz"):
                assert (await http.get(path, headers=headers)).status_code == 200
        too_big = await http.post("/generate", content=generate_body(LIMIT + 1))  # the limit holds regardless
    assert too_big.status_code == 413
    assert (await handle.generate.remote("hi", max_tokens=1))["output_tokens"] == 1


@serve_test
async def test_every_route_but_health_needs_the_key(keyed_app):
    url, _ = keyed_app
    routes = protected_routes()
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for auth in (None, "Bearer wrong-key", f"Basic {KEY}", KEY, "Bearer", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}"):
            headers = {"Authorization": auth} if auth else {}
            for method, path in routes:
                response = await http.request(method, path, headers=headers, json={} if method == "POST" else None)
                assert response.status_code == 401, (method, path, auth, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
                if method != "HEAD":
                    assert envelope(response.content, 401)["type"] == "AuthenticationError"
        for path in ("/health", "/healthz", "/ping", "/version"):  # probes, and vLLM's open /version
            assert (await http.get(path)).status_code == 200, path
        assert (await http.post("/ping")).status_code == 200  # SageMaker's probe is a POST
        assert (await http.get("/version")).json()["version"] == importlib.import_module("vllm").__version__
        good = {"Authorization": f"Bearer {KEY}"}
        for path in ("/v1/models", "/stats", "/openapi.json", "/docs"):
            assert (await http.get(path, headers=good)).status_code == 200, path
        generate = await http.post("/generate", json={"prompts": ["a b"], "task_id": "t"}, headers=good)
    assert generate.status_code == 200 and generate.json()["task_id"] == "t"


@serve_test
async def test_the_openai_client_with_the_key_works_streaming_too(keyed_app):
    openai = pytest.importorskip("openai")
    url, _ = keyed_app
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    chat = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert chat.usage.completion_tokens == 3
    stream = await client.completions.create(model=MODEL, prompt="the quick brown fox", max_tokens=6, stream=True)
    pieces = [chunk.choices[0].text async for chunk in stream if chunk.choices]
    assert "".join(pieces).startswith("[simulated] the quick") and len(pieces) >= 6  # token by token
    assert [m.id for m in (await client.models.list()).data] == [MODEL]
    wrong = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        await wrong.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert caught.value.status_code == 401 and "invalid API key" in str(caught.value)


@serve_test
async def test_handle_calls_need_no_key(keyed_app):
    _, handle = keyed_app
    assert (await handle.generate.remote("hello there", max_tokens=2))["output_tokens"] == 2
    items = [item async for item in handle.options(stream=True).generate_stream.remote("a b", max_tokens=2)]
    assert items[-1]["type"] == "result"
    assert (await handle.stats.remote())["engine"] == "simulated"


@serve_test
async def test_the_key_from_the_replicas_environment(env_app):
    url, handle = env_app
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        assert (await http.get("/v1/models")).status_code == 401
        assert (await http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})).status_code == 401
        good = await http.get("/v1/models", headers={"Authorization": "Bearer sk-from-the-environment"})
        assert good.status_code == 200 and good.json()["data"][0]["id"] == MODEL
        assert (await http.get("/health")).status_code == 200
    assert (await handle.generate.remote("x", max_tokens=1))["output_tokens"] == 1


@serve_test
async def test_a_body_over_the_limit_gets_413_and_never_reaches_the_engine(keyed_app):
    url, handle = keyed_app
    good = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    before = (await handle.stats.remote())["batcher"]["total_submitted"]
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        over = await http.post("/generate", content=generate_body(LIMIT + 1), headers=good)
        assert over.status_code == 413, over.text
        assert "4096 bytes" in envelope(over.content, 413)["message"]
        assert (await handle.stats.remote())["batcher"]["total_submitted"] == before
        at = await http.post("/generate", content=generate_body(LIMIT), headers=good)
        assert at.status_code == 200, at.text
    assert (await handle.stats.remote())["batcher"]["total_submitted"] == before + 1


@serve_test
async def test_a_chunked_body_is_counted_and_stopped_at_the_limit(keyed_app):
    url, handle = keyed_app
    good = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}

    async def chunks(body: bytes, size: int = 1000) -> AsyncIterator[bytes]:
        for start in range(0, len(body), size):
            yield body[start : start + size]

    before = (await handle.stats.remote())["batcher"]["total_submitted"]
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        over = await http.post("/generate", content=chunks(generate_body(2 * LIMIT)), headers=good)
        assert over.status_code == 413, over.text
        assert over.request.headers["transfer-encoding"] == "chunked" and "content-length" not in over.request.headers
        assert envelope(over.content, 413)
        assert (await handle.stats.remote())["batcher"]["total_submitted"] == before
        at = await http.post("/generate", content=chunks(generate_body(LIMIT)), headers=good)
        assert at.status_code == 200, at.text
        streamed = await http.post(
            "/v1/completions",
            content=chunks(json.dumps({"prompt": "a b c", "max_tokens": 3, "stream": True}).encode(), 7),
            headers=good,
        )
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")


@serve_test
async def test_abusive_framing(keyed_app):
    url, handle = keyed_app
    before = (await handle.stats.remote())["batcher"]["total_submitted"]
    path = httpx.URL(url).path + "/generate"

    def head(*headers: str, auth: bool = True) -> str:
        lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", "Connection: close"]
        return "\n".join([*lines, *([f"Authorization: Bearer {KEY}"] if auth else []), *headers, ""])

    # A huge Content-Length with a tiny body: refused at once, not waited for.
    status, headers, body = await raw_http(url, head("Content-Length: 1000000000000"), b"{}")
    assert status == 413 and envelope(body, 413) and headers["connection"] == "close"
    # No key: 401 first, whatever the size (nothing is read).
    status, headers, _ = await raw_http(url, head("Content-Length: 1000000000000", auth=False), b"{}")
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    # Malformed framing: 400 (from the HTTP server in front, or from the door).
    for bad in (["Content-Length: abc"], ["Content-Length: -1"], ["Content-Length: 2", "Content-Length: 3"]):
        status, _, _ = await raw_http(url, head(*bad), b"{}")
        assert status == 400, bad
    assert (await handle.stats.remote())["batcher"]["total_submitted"] == before
