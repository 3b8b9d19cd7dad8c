"""`make status`'s direct URLs (``serve_app.direct``): Serve's target groups as URLs a client can reach."""

from __future__ import annotations

import pytest

from serve_app.direct import direct_urls


def details(host: str | None, groups: list[dict]) -> dict:
    """Serve's instance details (``ServeInstanceDetails``, what the dashboard returns), the parts read here."""
    return {
        "proxies": {},
        "applications": {},
        "http_options": {"host": host, "port": 8000} if host is not None else None,
        "target_groups": groups,
    }


def group(app: str, route: str, ports: list[int], protocol: str = "HTTP") -> dict:
    targets = [{"ip": "10.0.0.5", "port": p, "instance_id": f"r{p}", "name": f"replica-{p}"} for p in ports]
    return {"app_name": app, "route_prefix": route, "protocol": protocol, "targets": targets}


def test_each_apps_http_targets_become_urls_with_its_route_and_grpc_is_left_out():
    got = direct_urls(
        details(
            "0.0.0.0",
            [
                group("llm", "/", [30001]),
                group("embeddings", "/v1/embeddings", [30000, 30002]),
                group("llm", "/", [40000], protocol="gRPC"),
            ],
        )
    )
    assert got == {
        "llm": ["http://10.0.0.5:30001"],
        "embeddings": ["http://10.0.0.5:30000/v1/embeddings", "http://10.0.0.5:30002/v1/embeddings"],
    }


@pytest.mark.parametrize(
    ("bound", "host"), [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "10.0.0.5"), ("::", "10.0.0.5"), (None, "10.0.0.5")]
)
def test_a_url_names_the_host_the_replica_binds_not_the_node_ip_it_cannot_answer_on(bound, host):
    """Serve reports the node's IP, but a replica binds Serve's HTTP host: with serve_config.yaml's 127.0.0.1 the
    node's IP refuses the connection."""
    assert direct_urls(details(bound, [group("llm", "/", [30001])])) == {"llm": [f"http://{host}:30001"]}
