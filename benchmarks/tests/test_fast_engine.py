"""The fast-engine benchmark's parts that need no server: the tiny model it makes, the CPU it charges to each role
of a peer's processes, and how rounds become medians and ratios to vllm."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fast_engine.cli import page
from benchmarks.fast_engine.cpu import ROLES, Sampler, name, role, snapshot, spent, spent_by_name
from benchmarks.fast_engine.model import TINY, make_tiny_model
from benchmarks.fast_engine.runs import (
    AS_VLLM,
    ONE_CORE,
    PACED,
    PACED_INTERVAL_S,
    SCORING,
    add_ratios,
    row,
    run_status,
    serving_cpu,
    started_as,
    summary,
)
from benchmarks.fast_engine.scoring import PROMPT_TOKENS, body, prompts
from benchmarks.serving.peers import app_overrides
from serve_app.config import AppConfig
from serve_app.engines.procs import CLOCK_TICKS


def test_the_tiny_model_is_the_bundled_models_config_shrunk_with_its_tokenizer_and_seeded_weights(tmp_path):
    pytest.importorskip("transformers")
    from safetensors.numpy import load_file

    from serve_app.models import prepare

    source = prepare()
    a = make_tiny_model(tmp_path / "a", seed=3)
    b = make_tiny_model(tmp_path / "b", seed=3)
    config, bundled = json.loads((a / "config.json").read_text()), json.loads((source / "config.json").read_text())
    assert {k: config[k] for k in TINY} == TINY
    assert config["vocab_size"] == bundled["vocab_size"] and config["eos_token_id"] == bundled["eos_token_id"]
    assert (a / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    assert not (a / ".prepared").exists()
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)  # the same seed, the same weights
    assert sum(w.size for w in wa.values()) < 5_000_000  # tiny: the vocabulary's embedding is most of it


def test_a_model_that_is_not_a_llama_is_refused_by_name(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match="'bert' model"):
        make_tiny_model(tmp_path / "out", source=tmp_path / "src")


@pytest.mark.parametrize(
    ("title", "expected"),
    [
        ("VLLM::EngineCore", "engine"),
        ("VLLM::Worker", "engine"),
        ("ray::HAProxyManager", "proxy"),
        ("ray::ServeReplica:llm:LLMServer", "replica"),
        ("ray::ServeReplica:embeddings:EmbeddingServer", "other"),
        ("/usr/sbin/haproxy -f /tmp/rt/haproxy.cfg", "proxy"),
        ("ray::ProxyActor", "proxy"),
        ("ray::DashboardAgent", "agent"),
        ("python -m vllm.entrypoints.openai.api_server --model /tmp/tiny", "api server"),
        ("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --node_id", "other"),
    ],
)
def test_each_process_of_a_peer_has_its_role(title, expected):
    assert role(title) == expected and expected in ROLES


@pytest.mark.parametrize(
    ("title", "expected"),
    [
        ("ray::ServeController.listen_for_change", "ServeController"),  # a Ray worker's title names its method
        ("ray::ServeReplica:llm:LLMServer", "ServeReplica:llm:LLMServer"),
        ("VLLM::Worker", "VLLM::Worker"),
        (
            "/venv/bin/python -u /venv/lib/python3.11/site-packages/ray/_private/log_monitor.py --logs-dir=/tmp/x",
            "log_monitor.py",
        ),
        ("/venv/bin/python /venv/bin/serve run /tmp/serve_config.yaml", "serve"),
        (
            "/venv/bin/python -m vllm.entrypoints.openai.api_server --model /tmp/tiny",
            "vllm.entrypoints.openai.api_server",
        ),
        ("/venv/bin/python -B -c from multiprocessing.forkserver import main", "python -c"),
        (
            "ray-dashboard-NodeHead-0 (/venv/bin/python -B -c from multiprocessing.forkserver import main)",
            "ray-dashboard-NodeHead-0",
        ),
        ("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --node_id=x", "raylet"),
        ("", "?"),
    ],
)
def test_each_process_has_a_short_name_by_its_command_line(title, expected):
    assert name(title) == expected


def test_the_cpu_a_marked_process_spends_is_counted_from_proc(tmp_path):
    """A child carrying the marker burns 0.3 s of CPU once told to (its own clock, not the wall's): the snapshots
    around the burn count that for it, less /proc's rounding to clock ticks, and nothing for any other process."""
    marker = str(tmp_path / "marker")
    burn = (
        "import sys, time\n"
        "sys.stdin.readline()\n"
        "start = time.process_time()\n"
        "while time.process_time() - start < 0.3: pass\n"
        "print('burnt', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", burn],
        env={**os.environ, "RAY_TMPDIR": marker},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        before = snapshot(marker)
        assert [key[0] for key in before] == [child.pid]
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "burnt\n"
        used = spent(before, snapshot(marker))
    finally:
        child.stdin.close()
        child.wait()
    assert used["other"] >= 0.3 - 4 / CLOCK_TICKS and sum(used.values()) == used["other"]


def test_a_replicas_engine_is_told_by_parentage_whatever_its_title(tmp_path):
    """A process below the app's replica is its engine even before (or without) vLLM's title."""
    marker = str(tmp_path / "marker")
    replica = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.readline()'], stdin=subprocess.PIPE)\n"
        "print(child.pid, flush=True)\n"
        "sys.stdin.readline()\n"
        "child.stdin.close(); child.wait()\n"
    )
    argv = [sys.executable, "-c", replica, "ray::ServeReplica:llm:LLMServer"]
    parent = subprocess.Popen(
        argv, env={**os.environ, "RAY_TMPDIR": marker}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        engine = int(parent.stdout.readline())
        roles = {pid: kind for (pid, _), (kind, _, _) in snapshot(marker).items()}
    finally:
        parent.stdin.close()
        parent.wait()
    assert roles == {parent.pid: "replica", engine: "engine"}


def test_a_process_below_a_marked_one_is_the_peers_even_where_its_environment_lost_the_marker(tmp_path):
    """A process whose environment /proc no longer shows the marker (Ray's dashboard agent overwrites it with its
    title in some runs) is counted when a marked process started it: here a child given an empty environment."""
    marker = str(tmp_path / "marker")
    parent_code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.readline()'], stdin=subprocess.PIPE,"
        " env={})\n"
        "print(child.pid, flush=True)\n"
        "sys.stdin.readline()\n"
        "child.stdin.close(); child.wait()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code, "ray::DashboardAgent"],
        env={**os.environ, "RAY_TMPDIR": marker},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        child = int(parent.stdout.readline())
        assert marker.encode() not in Path(f"/proc/{child}/environ").read_bytes()
        roles = {pid: kind for (pid, _), (kind, _, _) in snapshot(marker).items()}
    finally:
        parent.stdin.close()
        parent.wait()
    assert roles == {parent.pid: "agent", child: "other"}


def test_a_process_started_between_snapshots_counts_from_its_start_and_a_gone_one_not_at_all():
    before = {(1, 10): ("replica", "ServeReplica:llm:LLMServer", 5.0), (2, 20): ("engine", "VLLM::Worker", 7.0)}
    after = {  # 2 ended; 3 and 4 are new (a reused pid is new too), two processes of one name
        (1, 10): ("replica", "ServeReplica:llm:LLMServer", 6.5),
        (3, 30): ("proxy", "haproxy", 0.25),
        (4, 40): ("proxy", "haproxy", 0.5),
    }
    assert spent(before, after) == {
        "engine": 0.0,
        "replica": 1.5,
        "proxy": 0.75,
        "api server": 0.0,
        "agent": 0.0,
        "other": 0.0,
    }
    assert spent_by_name(before, after) == {"ServeReplica:llm:LLMServer": 1.5, "haproxy": 0.75}


def test_a_window_is_counted_from_the_snapshots_just_outside_it():
    sampler = Sampler("unused")  # not started: its snapshots set by hand, one a second
    sampler.times = [10.0, 11.0, 12.0, 13.0]
    sampler.snapshots = [{(1, 1): ("replica", "ServeReplica:llm:LLMServer", float(cpu))} for cpu in (0, 2, 5, 9)]
    assert sampler.spent_between(11.5, 12.5)["replica"] == 7.0  # from 11.0's snapshot to 13.0's
    assert sampler.by_name_between(11.5, 12.5) == {"ServeReplica:llm:LLMServer": 7.0}
    assert sampler.spent_between(11.0, 12.0)["replica"] == 3.0  # snapshots at the bounds themselves
    assert sampler.spent_between(0.0, 99.0)["replica"] == 9.0  # beyond them: the first and the last


def test_rounds_give_medians_and_per_round_ratios_to_vllm():
    def run(peer, rnd, tok_s, itl_p99, cpu, failed=0):
        metrics = {"output_tok_s": tok_s, "itl_p99_ms": itl_p99, "serving_cpu_per_1k": cpu, "ttft_p99_ms": 1000.0}
        status = f"{failed} failed: boom" if failed else "ok"
        return row(peer, "openai", 256, rnd, status, completed=512 - failed, failed=failed, **metrics)

    rows = [run("vllm", 0, 1000, 100, 1.0), run("app", 0, 2000, 300, 2.0)]
    rows += [run("app", 1, 1500, 100, 1.0, failed=3), run("vllm", 1, 500, 100, 2.0)]  # 3 failed: still counted
    rows.append(row("vllm-all-cores", "openai", 256, 0, "did not deploy: boom"))
    add_ratios(rows)
    vllm, app, other = summary(rows)  # in the order the peers first ran
    assert app["peer"] == "app" and app["rounds"] == 2 and app["output_tok_s"] == 1750
    assert app["failed"] == 3 and app["status"] == "3 failed: boom"
    assert app["tput_vs_vllm"] == 2.5 and app["tput_vs_vllm_range"] == (2.0, 3.0)  # 2x and 3x in their own rounds
    assert app["itl_p99_vs_vllm"] == 2.0 and app["serving_cpu_vs_vllm"] == 1.25
    assert vllm["tput_vs_vllm"] == 1.0
    assert other["rounds"] == 0 and other["status"] == "did not deploy: boom" and math.isnan(other["output_tok_s"])
    assert vllm["status"] == "ok" and vllm["failed"] == 0
    text = page({"config": config(), "summary": [app, vllm, other]}, 1.0)
    assert "| app | openai | 256 | 2 | 3 | 1,750 | 2.50 |" in text
    assert "- app / openai / 256: 3 failed: boom" in text
    assert "- vllm-all-cores / openai / 256: did not deploy: boom" in text


def test_the_scoring_load_gets_its_own_table_with_wall_time_ratios_to_vllm():
    def run(peer, rnd, wall):
        metrics = {"wall_s": wall, "request_p50_ms": 200.0, "request_p99_ms": 300.0, "serving_cpu_ms_per_request": 9.0}
        return row(peer, SCORING, 8, rnd, "ok", completed=200, failed=0, **metrics)

    rows = [run("vllm", 0, 5.0), run("app", 0, 7.5), run("app", 1, 5.5), run("vllm", 1, 5.0)]
    rows.append(row("vllm", "openai", 64, 0, "ok", completed=128, failed=0, output_tok_s=1000.0))
    add_ratios(rows)
    app = next(s for s in summary(rows) if s["peer"] == "app")
    assert app["wall_vs_vllm"] == 1.3 and app["wall_vs_vllm_range"] == (1.1, 1.5)
    assert math.isnan(rows[-1]["wall_vs_vllm"])  # a streaming row has no wall time to compare
    cfg = config() | {"scoring": {"requests": 200, "concurrency": 8}}
    text = page({"config": cfg, "summary": summary(rows)}, 1.0)
    assert "| app | 8 | 2 | 0 | 6.50 | 1.30 | 200.0 | 300.0 | 9.00 |" in text
    assert "| vllm | openai | 64 |" in text and "| app | scoring |" not in text  # not among the streaming rows


def test_scoring_prompts_are_seeded_and_of_the_load_s_lengths():
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from serve_app.models import prepare

    folder = prepare()
    texts = prompts(folder, 20, seed=1)
    assert texts == prompts(folder, 20, seed=1) and texts != prompts(folder, 20, seed=2)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    low, high = PROMPT_TOKENS
    assert all(low // 2 <= n <= 2 * high for n in lengths), lengths  # decoded text re-tokenizes about as long
    assert body(texts[0]) | {"prompt": ""} == {
        "model": "SmolLM2-135M-Instruct",
        "prompt": "",
        "max_tokens": 1,
        "echo": True,
        "logprobs": 1,
        "temperature": 0,
    }


def test_a_run_s_status_and_its_serving_cpu():
    assert run_status(0, []) == "ok"
    assert run_status(2, ["boom", "bang"]) == "2 failed: boom; bang"
    assert len(run_status(1, ["x" * 1000])) == len("1 failed: ") + 300  # the errors cut to 300 characters
    assert serving_cpu({"engine": 5.0, "replica": 1.0, "proxy": 0.5, "other": 0.25}) == 1.75  # all but the engine


def config() -> dict:
    return {
        "model": "tiny",
        "dtype": "float32",
        "cores": 2,
        "rounds": 2,
        "input_len": 128,
        "output_len": 256,
        "prompts_per_slot": 2,
    }


def test_the_paced_peer_is_the_app_with_its_streams_paced():
    fleet = {"model": "/tiny", "served_model_name": "tiny"}
    assert started_as("app", fleet) == ("app", fleet) and started_as("vllm", fleet) == ("vllm", fleet)
    kind, args = started_as(PACED, fleet)
    assert kind == "app" and args["model"] == "/tiny" and fleet == {"model": "/tiny", "served_model_name": "tiny"}
    config = AppConfig.model_validate({"engine": "simulated", "batcher": args["batcher"]})  # a setting the app takes
    assert config.batcher.stream_interval_s == PACED_INTERVAL_S > 0


def test_the_one_core_peers_are_the_app_with_a_core_kept_from_its_engine():
    fleet = {"model": "/tiny", "served_model_name": "tiny"}
    assert started_as(ONE_CORE, fleet) == (ONE_CORE, fleet) and started_as(AS_VLLM, fleet) == (AS_VLLM, fleet)
    llm, _ = app_overrides(ONE_CORE, None, fleet)  # what `running` starts for it
    assert llm["model"] == "/tiny" and "vllm" not in fleet
    config = AppConfig.model_validate({"engine": "simulated", "vllm": llm["vllm"]})  # settings the app takes
    assert config.vllm.cpu_reserved_cores == 1
    llm, _ = app_overrides(AS_VLLM, None, fleet)
    config = AppConfig.model_validate({"engine": "simulated", "vllm": llm["vllm"]})
    assert config.vllm.cpu_reserved_cores == 1 and config.vllm.max_num_batched_tokens is None
