"""Placement groups for engines on several devices: the deployment options a config implies (GPU bundles, as a
tensor- or pipeline-parallel vLLM engine needs them), and replicas really placed by them, with CPU bundles, on a
local multi-node Ray cluster (``ray.cluster_utils.Cluster``) in a subprocess of its own."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harness.launcher import private_cluster_result
from harness.ports import free_port
from serve_app.config import AppConfig
from serve_app.serving.options import deployment_options


def test_tensor_parallel_replicas_get_one_gpu_bundle_per_worker_with_the_replica_in_the_first():
    config = AppConfig(placement={}, vllm={"engine_args": {"tensor_parallel_size": 2}}, cpus_per_replica=0.5)
    options = deployment_options(config)
    assert options["placement_group_bundles"] == [{"GPU": 1.0, "CPU": 1.5}, {"GPU": 1.0, "CPU": 1.0}]
    assert options["placement_group_strategy"] == "STRICT_PACK"  # tensor parallelism: one node
    assert options["ray_actor_options"] == {"num_cpus": 0.5, "num_gpus": 0}  # the engine's workers hold the GPUs
    pipeline = AppConfig(
        placement={"strategy": "PACK"},
        vllm={"engine_args": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}},
    )
    assert len(deployment_options(pipeline)["placement_group_bundles"]) == 4
    assert "placement_group_bundles" not in deployment_options(AppConfig())  # one device: no group


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"placement": {"workers": 3}, "vllm": {"engine_args": {"tensor_parallel_size": 2}}}, "placement.workers"),
        ({"placement": {}, "gpus_per_replica": 1}, "gpus_per_replica"),
        ({"placement": {"bundle_per_worker": {}}}, "bundle_per_worker"),
        ({"placement": {"bundle_per_worker": {"GPU": -1}}}, "bundle_per_worker"),
        ({"placement": {"strategy": "ANYWHERE"}}, "strategy"),
    ],
)
def test_bad_placement_fails_naming_the_setting(args, words):
    with pytest.raises(ValidationError, match=words):
        AppConfig.model_validate(args)


CLUSTER = """
import json, sys
import ray
from ray import serve
from ray.cluster_utils import Cluster

from serve_app.app import build_app

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
for _ in range(2):
    cluster.add_node(num_cpus=1)
ray.init(address=cluster.address, log_to_driver=False)
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})
out = {}
for strategy, cpu in (("SPREAD", 0.5), ("STRICT_PACK", 0.25)):
    args = {
        "engine": "simulated",  # the SIMULATED engine: what is placed is the replica and its bundles
        "cpus_per_replica": 0.25,
        "autoscaling": {"min_replicas": 1, "max_replicas": 1},
        "vllm": {"engine_args": {"pipeline_parallel_size": 2}},
        "placement": {"bundle_per_worker": {"CPU": cpu}, "strategy": strategy},
    }
    name = strategy.lower()
    handle = serve.run(build_app(args), name=name, route_prefix="/" + name)
    text = handle.generate.remote("hello there", max_tokens=2).result()["text"]
    node = handle.stats.remote().result()["replica"]["node_id"]
    groups = [
        {"bundles": g["bundles"], "nodes": g["bundles_to_node_id"]}
        for g in ray.util.placement_group_table().values()
        if g["state"] == "CREATED" and g["strategy"] == strategy
    ]
    out[strategy] = {"text": text, "replica_node": node, "groups": groups}
    serve.delete(name)
print("RESULT " + json.dumps(out), flush=True)
serve.shutdown()
ray.shutdown()
cluster.shutdown()
"""


@pytest.mark.system
def test_replicas_are_placed_by_their_bundles_across_the_nodes_of_a_cluster():
    result = private_cluster_result(["-c", CLUSTER, str(free_port())], timeout_s=300)
    spread, packed = result["SPREAD"], result["STRICT_PACK"]
    for placed, first in ((spread, {"CPU": 0.75}), (packed, {"CPU": 0.5})):
        assert placed["text"] == "[simulated] hello there"  # the replica serves from its group
        (group,) = placed["groups"]
        assert group["bundles"]["0"] == first  # the replica's own CPUs in the first bundle
        assert placed["replica_node"] == group["nodes"]["0"]  # and the replica runs there
    assert len(set(spread["groups"][0]["nodes"].values())) == 2  # SPREAD: the bundles on two nodes
    assert len(set(packed["groups"][0]["nodes"].values())) == 1  # STRICT_PACK: on one
