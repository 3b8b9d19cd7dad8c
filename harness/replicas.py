"""An app's Serve replicas as a driver of its cluster sees them, read from Ray's named actors: no router between."""

from __future__ import annotations

from typing import Any

SERVER_DEPLOYMENT = "LLMServer"
"""The generation app's serving deployment (its other, HAProxy's ingress router ``TokenRoute``, serves no request)."""


def replica_actors(app: str, deployment: str = SERVER_DEPLOYMENT) -> dict[str, Any]:
    """The live replica actors of ``app``'s ``deployment``, by replica id (Serve names them
    ``SERVE_REPLICA::<app>#<deployment>#<id>``)."""
    import ray

    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    named = ray.util.list_named_actors(all_namespaces=True)
    return {
        a["name"].rsplit("#", 1)[-1]: ray.get_actor(a["name"], namespace=a["namespace"])
        for a in named
        if a["name"].startswith(prefix)
    }
