"""Each app's direct HTTP URLs: with direct ingress on (``serve.env``), every app's ingress replica also serves
HTTP on a port of its own, which HAProxy on port 8000 forwards to. Serve publishes those ports as the cluster's
target groups (what a load balancer in front reads), or, under HAProxy, hands them to HAProxy's manager and
publishes HAProxy instead; this lists them.

    RAY_AUTH_MODE=token .venv/bin/python -m serve_app.direct      # one line per app: its name, then its URLs

    direct_urls(serve_details)   # {"embeddings": ["http://127.0.0.1:30001/v1/embeddings"], ...}
"""

from __future__ import annotations

import argparse
import os
from typing import Any

DEFAULT_DASHBOARD = "http://localhost:8265"


def direct_urls(details: dict[str, Any]) -> dict[str, list[str]]:
    """Each app's HTTP targets, from Serve's instance details (``ServeInstanceDetails``), as URLs with the app's
    route prefix. An app's group points at the proxy where direct ingress is off or no replica of it runs yet."""
    from ray.serve.schema import ServeInstanceDetails

    instance = ServeInstanceDetails(**details)
    bound = instance.http_options.host if instance.http_options else None
    out: dict[str, list[str]] = {}
    for group in instance.target_groups:
        if group.protocol == "HTTP" and group.app_name:
            route = "" if group.route_prefix == "/" else group.route_prefix
            out[group.app_name] = [f"http://{host(target.ip, bound)}:{target.port}{route}" for target in group.targets]
    return out


def replica_groups() -> list[dict[str, Any]]:
    """The target groups Serve's controller gives HAProxy's manager (the replicas' own ports), from a process
    connected to the cluster: under HAProxy, Serve's instance details list HAProxy as every app's target."""
    import ray
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    groups = ray.get(client._controller.get_target_groups.remote(from_proxy_manager=True))
    return [group.model_dump(mode="json") for group in groups]


def replica_urls(details: dict[str, Any]) -> dict[str, list[str]]:
    """:func:`direct_urls` of ``details``, or of :func:`replica_groups` where the details name no app's replicas
    (HAProxy); connects this process to the running cluster if it is not."""
    urls = direct_urls(details)
    if urls:
        return urls
    import ray

    if not ray.is_initialized():
        ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    return direct_urls({**details, "target_groups": replica_groups()})


def host(node_ip: str, bound: str | None) -> str:
    """Where a replica's port answers: Serve names the node's IP, but each replica binds Serve's HTTP host (the
    ``http_options.host`` of serve_config.yaml), so a host of 127.0.0.1 answers on 127.0.0.1 only."""
    return node_ip if bound in (None, "", "0.0.0.0", "::") else bound


def main(argv: list[str] | None = None) -> int:
    """Print each running app's direct URLs (the cluster's dashboard: ``--address``, as ``serve status``)."""
    from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

    parser = argparse.ArgumentParser(prog="python -m serve_app.direct", description=main.__doc__)
    parser.add_argument("--address", default=os.environ.get("RAY_DASHBOARD_ADDRESS", DEFAULT_DASHBOARD))
    args = parser.parse_args(argv)
    for app, urls in sorted(replica_urls(ServeSubmissionClient(args.address).get_serve_details()).items()):
        print(app, *urls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
