"""The token router's session affinity (serving/routing/sessions.py, router.py): a session's requests go back to the
replica it was last sent to within the prefix score's guard (``prefix_max_share`` of a budget) and move beyond it;
sessions of replicas that leave are forgotten; without a session id, or with ``session_affinity`` off, nothing
changes; and the ingress router at HAProxy's door passes the client's ``x-session-id`` on as Serve's session id.
Unit tests on Ray Serve's real router machinery with fake replicas, and on ``IngressRouter.route`` with a fake
handle that builds Serve's real request metadata (no Ray)."""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest
from ray.serve._private.default_impl import create_init_handle_options, get_request_metadata
from ray.serve.handle import DeploymentHandle
from ray.serve.request_router import PendingRequest
from starlette.requests import Request

from serve_app.config import AppConfig
from serve_app.serving.ingress_router import IngressRouter, route_options
from serve_app.serving.options import deployment_options
from serve_app.serving.routing import TokenLoadRouter
from serve_app.serving.routing.sessions import CAPACITY, SessionIndex, made_by, replica_tag, response_id

from .test_routing import BUDGET, FakeReplica, request, route, router_with

PROMPT = "x" * 3_600  # 900 tokens: with max_tokens=100, a request costs 1,000


def in_session(session: str, *args: Any, **kwargs: Any) -> PendingRequest:
    """A handle call of ``session`` (Serve's ``RequestMetadata.session_id``; "" for none)."""
    pending = request(*args, **kwargs)
    pending.metadata.session_id = session
    return pending


async def went(sessions: list[str], **settings: Any) -> list[str]:
    """Where requests of 1,000 tokens each, of ``sessions`` in turn, go on replicas ``a`` (holding 0 tokens) and
    ``b`` (400); none completes, so each adds its tokens where it went. No prefix score: every prompt is the same;
    the guard a quarter of a budget."""
    a, b = FakeReplica("a", 0), FakeReplica("b", 400)
    router = await router_with(a, b, settle_s=0.0, tie_fraction=0, prefix_weight=0, prefix_max_share=0.25, **settings)
    out = []
    for session in sessions:
        pending = in_session(session, "generate", PROMPT, max_tokens=100)
        replica = await route(router, pending)
        router.on_request_routed(pending, replica.replica_id, None)
        out.append(replica.replica_id.unique_id)
    return out


# -- The index ---------------------------------------------------------------------------------------------------


def test_the_index_keeps_the_newest_sessions_up_to_its_capacity_and_forgets_a_gone_replicas():
    index = SessionIndex(capacity=3)
    for n, session in enumerate("pqrs"):
        index.sent(session, f"r{n % 2}", f"req-{session}")
    assert len(index) == 3 and index.replica("p") is None  # the least recently routed went
    assert [index.replica(s) for s in "qrs"] == ["r1", "r0", "r1"]
    index.sent("q", "r0", "req-q2")  # q is the newest again: r goes next
    index.sent("t", "r0", "req-t")
    assert index.replica("r") is None and index.replica("q") == "r0"
    index.forget({"r1"})
    assert index.replica("s") is None and index.replicas() == {"r0"}
    index.sent("", "r0", "req-none")  # no session: nothing to remember
    assert len(index) == 2 and index.replica("") is None
    assert SessionIndex().capacity == CAPACITY == 10_000
    with pytest.raises(ValueError, match="capacity"):
        SessionIndex(capacity=0)


def test_a_session_follows_the_replica_that_took_its_newest_request_not_a_late_confirmation_of_an_older_one():
    index = SessionIndex()
    index.sent("s", "r0", "first")
    index.routed("s", "r1", "first")  # Serve took the next rank: r0 was full
    assert index.replica("s") == "r1"
    index.sent("s", "r0", "second")
    index.routed("s", "r1", "first")  # over gRPC a unary call is confirmed with its answer, after the next was sent
    assert index.replica("s") == "r0"
    index.routed("unknown", "r1", "x")
    assert index.replica("unknown") is None


def test_a_response_id_names_the_replica_that_made_it():
    made = response_id("b2kx9q1z")
    assert made.startswith("resp_" + replica_tag("b2kx9q1z")) and len(made) == 37 and made != response_id("b2kx9q1z")
    replicas = {"a7f3k0pq": "a", "b2kx9q1z": "b"}
    assert made_by(made, replicas.items()) == "b" and made_by(response_id("a7f3k0pq"), replicas.items()) == "a"
    assert made_by(response_id("gone0000"), replicas.items()) is None  # a replica since replaced: tokens decide
    for other in (None, 7, "resp_" + "0" * 32, "resp_" + "x" * 32, made + "0", made.upper()):
        assert made_by(other, replicas.items()) is None


# -- Ranking -----------------------------------------------------------------------------------------------------


async def test_a_session_stays_on_its_replica_within_the_guard_and_moves_with_its_request_beyond_it():
    """``a`` takes the session's first request (it holds less), and the next two although it then holds more than
    ``b``: its credit is 2,500 tokens (a quarter of 10,000). The fourth finds ``a`` holding 2,600 more than ``b``,
    past the guard: it goes to ``b``, and the session with it."""
    assert BUDGET * 0.25 == 2_500
    assert await went(["s"] * 8) == ["a", "a", "a", "b", "b", "b", "b", "b"]
    assert await went(["s", "t"] * 3) == ["a", "b", "a", "b", "a", "b"]  # two sessions: each on its own replica


async def test_without_a_session_id_or_with_affinity_off_routing_is_by_tokens_alone():
    by_tokens = ["a", "b", "a", "b", "a", "b", "a", "b"]
    assert await went([""] * 8) == by_tokens
    assert await went(["s"] * 8, session_affinity=False) == by_tokens
    a, b = FakeReplica("a", 0), FakeReplica("b", 400)
    router = await router_with(a, b, session_affinity=False)
    await route(router, in_session("s", "generate", PROMPT))
    assert len(router._sessions) == 0
    with pytest.raises(ValueError, match="session_affinity"):
        await router_with(a, session_affinity="yes")


async def test_a_responses_follow_up_goes_to_the_replica_that_made_the_response_it_continues():
    """``b`` holds 400 tokens more than ``a``, but made the response the request continues: it is credited as a
    session's replica is. A header's session decides where it has a replica; a handle's ``openai`` call is read."""
    a, b = FakeReplica("a", 0), FakeReplica("b", 400)
    router = await router_with(a, b, settle_s=0.0, tie_fraction=0, prefix_weight=0)
    continues = {"model": "m", "previous_response_id": response_id("b")}
    assert await route(router, request("__call__", **continues)) is b
    body = {"model": "m", "input": "and then?", **continues}
    assert await route(router, request("openai", "/v1/responses", body)) is b
    assert await route(router, request("openai", "/v1/chat/completions", body)) is a  # not a Responses call
    assert await route(router, request("__call__", model="m", previous_response_id="resp_unknown")) is a
    await route(router, in_session("s", "generate", PROMPT))  # s to a
    assert await route(router, in_session("s", "__call__", **continues)) is a
    router = await router_with(a, b, settle_s=0.0, tie_fraction=0, prefix_weight=0, session_affinity=False)
    assert await route(router, request("__call__", **continues)) is a


async def test_the_session_and_prefix_credits_share_one_bound():
    """A replica that holds the session and the request's whole prompt in its cache is credited 2,500 tokens (the
    bound), not twice that: holding 2,600 more than the other, it loses; holding 2,400 more, it wins."""
    busy, idle = FakeReplica("busy"), FakeReplica("idle")
    router = await router_with(busy, idle, tie_fraction=0, prefix_weight=10, prefix_max_share=0.25)
    cached = {busy.replica_id: 1_000.0}  # x 10: 10,000 tokens of prefix score, bounded to 2,500

    def first(busy_holds: float, session: Any) -> str:
        held = {busy.replica_id: busy_holds, idle.replica_id: 2_000.0}
        return router.rank([busy, idle], held, 1_000, cached, None, session)[0].replica_id.unique_id

    assert first(4_600, busy.replica_id) == "idle" and first(4_600, None) == "idle"
    assert first(4_400, busy.replica_id) == "busy" and first(4_400, None) == "busy"
    assert first(4_400, idle.replica_id) == "idle"  # both credited the bound: idle holds less


async def test_sessions_of_a_replica_that_leaves_or_dies_are_forgotten():
    a, b = FakeReplica("a", 0), FakeReplica("b", 400)
    router = await router_with(a, b, prefix_weight=0)
    for session in ("s", "t"):
        await route(router, in_session(session, "generate", PROMPT))
    assert router._sessions.replicas() == {a.replica_id, b.replica_id}  # s to a, then t to b (b held less by then)
    router.update_replicas([b])
    assert router._sessions.replica("s") is None and router._sessions.replica("t") == b.replica_id
    router.update_replicas([a, b])
    await route(router, in_session("u", "generate", PROMPT))
    gone = router._sessions.replica("u")
    router.on_replica_actor_died(gone)
    assert router._sessions.replica("u") is None


# -- Settings ----------------------------------------------------------------------------------------------------


def test_the_setting_reaches_the_router_and_is_validated():
    def kwargs(**routing: Any) -> dict[str, Any]:
        options = deployment_options(AppConfig(engine="simulated", routing=routing))
        return options["request_router_config"]["request_router_kwargs"]

    assert kwargs()["session_affinity"] is True and kwargs(session_affinity=False)["session_affinity"] is False
    with pytest.raises(pydantic.ValidationError, match="session_affinity"):
        AppConfig(engine="simulated", routing={"session_affinity": "sometimes"})


# -- The ingress router under HAProxy ------------------------------------------------------------------------------


def test_the_ingress_routers_options_carry_the_session_header_as_serve_matches_it():
    def headers(*pairs: tuple[bytes, bytes]) -> Any:
        return Request({"type": "http", "method": "POST", "path": "/", "headers": list(pairs)}).headers

    assert route_options("chat", headers((b"x-session-id", b"abc"))) == {"method_name": "chat", "session_id": "abc"}
    assert route_options("chat", headers((b"x_session_id", b"abc")))["session_id"] == "abc"  # as a proxy may write it
    assert route_options("generate", headers()) == {"method_name": "generate", "session_id": ""}


class FakeServer:
    """The ingress router's handle to the app: ``options`` are applied as Serve applies them (its real handle options
    and request metadata), and ``choose_replica`` asks ``router`` to rank ``replicas`` for the pending request."""

    def __init__(self, router: TokenLoadRouter, replicas: list[FakeReplica], options: Any = None) -> None:
        self.router, self.replicas = router, replicas
        self.handle_options = options or DeploymentHandle("LLMServer", "llm").handle_options

    def options(self, **kwargs: Any) -> FakeServer:
        return FakeServer(self.router, self.replicas, self.handle_options.copy_and_update(**kwargs))

    @contextlib.asynccontextmanager
    async def choose_replica(self, _reserve: bool = True, **kwargs: Any):
        metadata = get_request_metadata(create_init_handle_options(), self.handle_options)
        pending = PendingRequest(args=[], kwargs=kwargs, metadata=metadata)
        ranks = await self.router.choose_replicas(self.replicas, pending)
        yield SimpleNamespace(_replica=ranks[0][0], replica_id=ranks[0][0].replica_id.unique_id)


async def test_the_ingress_router_passes_the_clients_session_id_to_the_token_router():
    a, b = FakeReplica("a", 0), FakeReplica("b", 400)
    for replica in (a, b):
        replica.backend_http_endpoint = ("127.0.0.1", 9000 if replica is a else 9001)
    router = await router_with(a, b)
    routes = SimpleNamespace(_server=FakeServer(router, [a, b]))

    async def post(body: bytes, *headers: tuple[bytes, bytes]) -> dict[str, Any]:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        scope = {"type": "http", "method": "POST", "path": "/internal/route", "headers": list(headers)}
        return await IngressRouter.func_or_class.route(routes, Request(scope, receive))

    chosen = await post(b'{"prompt": "hi", "max_tokens": 4}', (b"x-session-id", b"chat-7"))
    assert chosen["port"] == 9000 and router._sessions.replica("chat-7") == a.replica_id
    await post(b'{"prompt": "hi", "max_tokens": 4}')
    assert len(router._sessions) == 1  # no header: no session
    follow_up = {"model": "m", "input": "and?", "previous_response_id": response_id("b")}
    assert (await post(json.dumps(follow_up).encode()))["port"] == 9001  # the replica that made the response
