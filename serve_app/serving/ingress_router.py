"""The token router at the HTTP door under HAProxy (``RAY_SERVE_ENABLE_HA_PROXY=1``, as serve.env sets it).

Why: with HAProxy, Serve's Python proxy is gone from the request path. HAProxy listens on port 8000 and forwards
each request straight to a replica's own HTTP port (Ray's direct ingress), so a request costs about what it costs
on vLLM's own server. HAProxy balances by its own rule (least connections), which knows nothing of tokens; for an
application that has an *ingress request router* attached, HAProxy first POSTs the request's body to that router's
``/internal/route`` and forwards the request to the replica it names (Ray 2.60; Ray Serve LLM's direct streaming
does the same with its ``LLMRouter``). This deployment is that router for the generation app: it reads the
body's cost fields (:func:`~serve_app.serving.routing.request_cost.body_call`) and asks the deployment's own
request router (:class:`~serve_app.serving.routing.TokenLoadRouter`) to pick, as for a handle call of the same
shape, without sending anything (the request itself goes through HAProxy). HAProxy forwards the client's
session header (Serve's ``x-session-id``) with the body; the router gets it as Serve's ``session_id``, for its
session affinity.

``/internal/route`` answers ``{"host", "port", "replica_id"}``; anything else (503 while no replica is up) makes
HAProxy answer 503 itself. HAProxy carries the request and its answer, so this router never sees one end: it asks
the replicas for their reports itself (:mod:`~serve_app.serving.routing.reports`) rather than wait for Serve's relay.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from ray import serve
from ray.serve._private.http_util import session_id_from_headers
from ray.serve.exceptions import DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle

from .routing.reports import poll_in_this_process
from .routing.request_cost import body_call

router_api = FastAPI(title="token-batching ingress router", docs_url=None, redoc_url=None, openapi_url=None)


# Above the class: serve.ingress copies the FastAPI app, and with it the class's methods, by value as it decorates
# the class, and the copies see only the globals defined by then.
def route_options(method: str, headers: Mapping[str, str]) -> dict[str, str]:
    """The handle options a request is routed with: the call its body is priced as, and the session id of its
    headers (Serve's ``x-session-id``, or ``RAY_SERVE_SESSION_ID_HEADER_KEY``; "" for none, as Serve's own)."""
    return {"method_name": method, "session_id": session_id_from_headers(headers) or ""}  # type: ignore[arg-type]


@serve.deployment(name="TokenRoute", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
@serve.ingress(router_api)
class IngressRouter:
    """HAProxy's ``/internal/route`` for one application: the replica its request router ranks first."""

    def __init__(self, server: DeploymentHandle, poll_s: float) -> None:
        self._server = server
        poll_in_this_process(poll_s)  # it sees no request end: it asks the replicas for their reports itself

    @router_api.post("/internal/route")
    async def route(self, request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError:
            body = None  # the replica answers the bad body itself; routing only needs a replica
        method, fields = body_call(body)
        handle = self._server.options(**route_options(method, request.headers))
        try:
            async with handle.choose_replica(_reserve=False, **fields) as selection:
                replica = selection._replica  # Ray's own LLMRouter reads the same private field
        except DeploymentUnavailableError as exc:
            raise HTTPException(status_code=503, detail=str(exc)) from exc
        endpoint = replica.backend_http_endpoint
        if endpoint is None:
            raise HTTPException(status_code=503, detail=f"replica {selection.replica_id} has no HTTP port yet")
        host, port = endpoint
        return {"host": host, "port": port, "replica_id": replica.replica_id.to_full_id_str()}


def haproxy_enabled() -> bool:
    """Whether Serve runs HAProxy at the HTTP door (``RAY_SERVE_ENABLE_HA_PROXY=1``). Serve reads the flag once,
    when ``ray.serve`` is imported; a script that sets it later would start HAProxy (the controller reads the
    environment) while its own build step thinks there is none, and HAProxy would silently bypass the token router:
    that mismatch raises instead."""
    from ray.serve._private.constants import RAY_SERVE_ENABLE_HA_PROXY as imported

    now = os.environ.get("RAY_SERVE_ENABLE_HA_PROXY", "0") == "1"
    if now != imported:
        raise RuntimeError(
            f"RAY_SERVE_ENABLE_HA_PROXY is {'1' if now else 'off'} now but was {'1' if imported else 'off'} when "
            "ray.serve was imported in this process (Serve reads it once, at import): set serve.env's settings "
            "before importing Ray"
        )
    return now


def with_ingress_router(app: serve.Application, poll_s: float) -> serve.Application:
    """``app`` with :class:`IngressRouter` attached as HAProxy's router for it (Ray's internal hook, the one Ray
    Serve LLM's direct streaming uses), asking each replica for its report every ``poll_s``."""
    return app._with_ingress_request_router(IngressRouter.bind(app, poll_s))
