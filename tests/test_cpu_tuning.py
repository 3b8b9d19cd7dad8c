"""CPU tuning (docs/cpu-tuning.md): a process holding a CPU engine can yield its cores to the engine
(``vllm.cpu_replica_niceness`` above 0): every thread it has drops to that niceness, and so do the threads it
starts afterwards; it never asks to rise (that needs privileges). ``vllm.cpu_reserved_cores: auto`` keeps no
core from the engine's compute on a small host, and vLLM's own reservation on a larger one; with every core
computing, ``vllm.cpu_spin_count: auto`` keeps the engine's idle threads from busy-waiting long on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from serve_app.config import VLLMSettings
from serve_app.config.embeddings import PoolingSettings
from serve_app.engines.async_llm import reserved_cores, spin_count, step_tokens
from serve_app.engines.cpu import GLOO_LOOP_THREAD, idle_gloo_threads

SCRIPT = textwrap.dedent(
    """
    import json, os, threading
    from serve_app.engines.cpu import yield_cores

    def niceness():
        return sorted({os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")})

    started, done = threading.Event(), threading.Event()
    def waits():
        started.set()
        done.wait()
    early = threading.Thread(target=waits)
    early.start()
    started.wait()
    yield_cores(HIGH)
    after, late = niceness(), []
    thread = threading.Thread(target=lambda: late.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
    thread.start()
    thread.join()
    yield_cores(LOW)
    print(json.dumps({"threads": len(os.listdir("/proc/self/task")), "after": after, "late": late,
                      "after_lower": niceness()}))
    done.set()
    """
)


def test_yield_cores_lowers_every_thread_and_those_started_later_and_never_raises_them():
    base = os.getpriority(os.PRIO_PROCESS, 0)
    high, low = max(base, 7), max(base, 3)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.replace("HIGH", str(high)).replace("LOW", str(low))],
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["threads"] >= 2  # the main thread and the one started before
    assert seen["after"] == [high]  # both threads, not only the caller
    assert seen["late"] == [high]  # a thread started afterwards inherits it
    assert seen["after_lower"] == [high]  # asking for less leaves them where they are


GLOO_SCRIPT = textwrap.dedent(
    """
    import json, subprocess, sys, threading

    def named(name, tids, ready):
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(name)
        tids.append(threading.get_native_id())
        ready.set()
        threading.Event().wait()

    gloo, other = [], []
    for name, tids in ((sys.argv[1], gloo), ("pt_gloo_runloop", other)):
        ready = threading.Event()
        threading.Thread(target=named, args=(name, tids, ready), daemon=True).start()
        ready.wait()
    if sys.argv[2] == "parent":  # and a child of its own, as vLLM's EngineCore has its worker
        leaf = subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[1], "leaf", ""], stdout=subprocess.PIPE,
                                text=True)
        below = json.loads(leaf.stdout.readline())
        gloo, other = gloo + below["gloo"], other + below["other"]
    print(json.dumps({"gloo": gloo, "other": other}), flush=True)
    sys.stdin.read()  # until the test is done
    """
)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_idle_gloo_threads_quiets_the_gloo_threads_of_every_process_below_and_nothing_else():
    """vLLM's worker is the replica's grandchild (replica -> EngineCore -> Worker): its gloo transport threads go to
    SCHED_IDLE, every other thread keeps its policy, and so do this process's own threads of that name."""
    import threading

    ready, stop = threading.Event(), threading.Event()

    def own() -> None:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(GLOO_LOOP_THREAD)
        ready.set()
        stop.wait()

    mine = threading.Thread(target=own, daemon=True)
    mine.start()
    ready.wait()
    child = subprocess.Popen(
        [sys.executable, "-c", GLOO_SCRIPT, GLOO_LOOP_THREAD, "parent", GLOO_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        tids = json.loads(child.stdout.readline())
        assert len(tids["gloo"]) == 2 and len(tids["other"]) == 2  # the child's and the grandchild's
        assert idle_gloo_threads() == 2
        assert [os.sched_getscheduler(t) for t in tids["gloo"]] == [os.SCHED_IDLE] * 2
        assert [os.sched_getscheduler(t) for t in tids["other"]] == [os.SCHED_OTHER] * 2
        assert os.sched_getscheduler(mine.native_id) == os.SCHED_OTHER  # not below this process: its own
    finally:
        stop.set()
        child.communicate("", timeout=30)


@pytest.mark.parametrize(
    ("setting", "cores", "reserved"),
    [("auto", 1, 0), ("auto", 2, 0), ("auto", 3, None), ("auto", 64, None), (None, 2, None), (0, 64, 0), (2, 2, 2)],
)
def test_reserved_cores_auto_gives_a_small_host_every_core_and_keeps_vllms_default_above(setting, cores, reserved):
    """None is vLLM's own default (one core for its scheduler); a number is passed on as it is."""
    assert reserved_cores(setting, cores) == reserved


@pytest.mark.parametrize(
    ("setting", "reserved", "spins"),
    [("auto", 0, 1_000), ("auto", None, None), ("auto", 1, None), (None, 0, None), (50, 0, 50), (0, None, 0)],
)
def test_spin_count_auto_limits_busy_waiting_only_where_the_engine_has_every_core(setting, reserved, spins):
    """None keeps libgomp's own; with a core reserved (None: vLLM's own reservation) its scheduler has one to itself."""
    assert spin_count(setting, reserved) == spins


@pytest.mark.parametrize(
    ("setting", "max_num_seqs", "on_gpu", "tokens"),
    [
        ("auto", None, False, 512),
        ("auto", 1024, False, 1024),
        ("auto", None, True, None),
        (None, None, False, None),
        (4096, None, False, 4096),
        (256, None, True, 256),
    ],
)
def test_step_tokens_auto_gives_a_cpu_small_steps_and_a_gpu_vllms_own(setting, max_num_seqs, on_gpu, tokens):
    """A CPU step of vLLM's 2048 prompt tokens takes seconds, and every arriving request waits for it; vLLM wants
    at least ``max_num_seqs`` a step. None is vLLM's own size; a number is passed on as it is."""
    assert step_tokens(setting, max_num_seqs, on_gpu) == tokens


@pytest.mark.parametrize(
    ("settings", "cores", "spins", "reserved"),
    [(VLLMSettings, 2, "1000", "0"), (VLLMSettings, 8, None, None), (PoolingSettings, 2, None, "0")],
)
def test_the_engine_starts_with_the_resolved_spin_count_and_reservation_in_its_environment(
    monkeypatch, settings, cores, spins, reserved
):
    """vLLM spawns its engine processes on a CPU, so they start with the environment ``start_async_llm`` holds while
    the engine starts (their /proc environ is unreadable once vLLM renames them); outside that, nothing is left set.
    The pooling engine keeps libgomp's own spinning (an embedding load runs step after step)."""
    vllm = pytest.importorskip("vllm", reason="needs the cpu extra (make setup installs it)")
    from vllm.v1.engine.async_llm import AsyncLLM

    from serve_app.engines import async_llm

    for name in ("GOMP_SPINCOUNT", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(async_llm.os, "sched_getaffinity", lambda pid: set(range(cores)))
    seen = {}

    def start(engine_args, **kwargs):
        seen.update(spins=os.environ.get("GOMP_SPINCOUNT"), reserved=os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU"))
        return object()

    monkeypatch.setattr(vllm, "AsyncEngineArgs", dict)  # no model to look up: only the environment matters here
    monkeypatch.setattr(AsyncLLM, "from_engine_args", start)
    async_llm.start_async_llm("a-model", settings(), on_gpu=False)
    assert seen == {"spins": spins, "reserved": reserved}
    assert "GOMP_SPINCOUNT" not in os.environ and "VLLM_CPU_NUM_OF_RESERVED_CPU" not in os.environ


@pytest.mark.parametrize(("gib", "nbytes"), [(2, 2 << 30), (0.25, 1 << 28)])
def test_the_kv_cache_size_reaches_vllm_as_an_engine_argument(monkeypatch, gib, nbytes):
    """A CPU host's KV cache is vLLM's ``kv_cache_memory_bytes``, not VLLM_CPU_KVCACHE_SPACE (whole GiB, and read
    by every engine the process starts), so a fraction of a GiB holds; an engine argument of the same name wins."""
    vllm = pytest.importorskip("vllm", reason="needs the cpu extra (make setup installs it)")
    from vllm.v1.engine.async_llm import AsyncLLM

    from serve_app.engines import async_llm

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    seen = []
    monkeypatch.setattr(vllm, "AsyncEngineArgs", dict)  # no model to look up: only the arguments matter here
    monkeypatch.setattr(AsyncLLM, "from_engine_args", lambda engine_args, **kwargs: seen.append(engine_args))
    async_llm.start_async_llm("a-model", VLLMSettings(cpu_kvcache_space_gb=gib), on_gpu=False)
    async_llm.start_async_llm("a-model", VLLMSettings(), False, {"kv_cache_memory_bytes": 12345})
    async_llm.start_async_llm("a-model", VLLMSettings(), on_gpu=True)
    assert [args.get("kv_cache_memory_bytes") for args in seen] == [nbytes, 12345, None]
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ
