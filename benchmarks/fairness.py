"""Two Ray Data jobs on one replica, fair share off and on: the token share each gets while both have work waiting.

**Replica**: one replica of the SIMULATED engine (a decode step of 10 ms + 0.1 ms a sequence, 32 sequences at
once, the batcher's ``max_inflight`` 32), the app's defaults otherwise; peers differ only in ``batcher.fair_share``.

**Jobs** (``serve_app.data.generate``, each in its own thread of this driver, with its own ``tenant``): a big job of
``BIG_ROWS`` prompts x ``BIG_TOKENS`` output tokens and, ``SMALL_START_S`` later, a small one of ``SMALL_ROWS``
prompts x ``SMALL_TOKENS`` tokens, each with 16 requests of 8 rows in flight (more than the replica runs at once, so
both keep work waiting). In arrival order (fair share off) each job gets the engine in proportion to the rows it
keeps queued and their lengths, so the job with the longer answers takes most of the tokens; VTC (fair share on)
admits next from the tenant served the fewest tokens.

**Measured**, two ways: (1) at the replica, what fair share evens out: the tokens (prompt + max_tokens, the
budget's unit) admitted for each tenant while *both* had rows queued there, from the replica's statistics
(``admitted_cost_by_tenant``, ``queued_by_tenant``) sampled every ``SAMPLE_S``: an interval counts when both
tenants had rows queued at its start and its end. (2) At the driver: each job's output tokens as its rows come
back (Ray Data streams them), over the window from the small job's first row back to its last, which also holds
its ramp-up and its tail. Each share against an equal one (0.5); the small job's wall time; the replica's tok/s.

    python -m benchmarks.fairness [--quick]   # benchmarks/results/fairness[-quick].{md,json}
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from typing import Any

from .lib.report import RESULTS, page

BIG_ROWS, BIG_TOKENS, BIG_CONCURRENCY = 2_000, 64, 16
SMALL_ROWS, SMALL_TOKENS, SMALL_CONCURRENCY = 200, 32, 16
SMALL_START_S = 30.0
SAMPLE_S = 0.2
PEERS = {"fair share off (arrival order)": False, "fair share on (VTC)": True}
APP: dict[str, Any] = {
    "engine": "simulated",
    "simulated": {"step_s": 0.01, "step_s_per_seq": 1e-4, "max_num_seqs": 32, "kv_cache_tokens": 16_384},
    "autoscaling": {"min_replicas": 1, "max_replicas": 1, "target_ongoing_requests": 64},
    "cpus_per_replica": 1.0,
    "max_tokens_limit": 1_024,
}


def run_job(name: str, rows: int, tokens: int, concurrency: int, log: list[tuple[float, str, int]]) -> None:
    """One job through the app; each batch of rows that comes back is logged as (time, job, output tokens)."""
    import ray.data

    from serve_app.data import generate

    items = [{"id": i, "prompt": f"{name} row {i}: " + "word " * (10 + i % 50)} for i in range(rows)]
    out = generate(
        ray.data.from_items(items),
        app="fair",
        concurrency=concurrency,
        batch_size=8,
        tenant=name,
        max_tokens=tokens,
        ignore_eos=True,
    )
    for batch in out.iter_batches(batch_size=None, batch_format="pandas"):
        assert not batch["error"].notna().any(), batch["error"].dropna().tolist()[:3]
        log.append((time.monotonic(), name, int(batch["output_tokens"].sum())))


def sample(stop: threading.Event, samples: list[tuple[dict[str, int], dict[str, int]]]) -> None:
    """Every ``SAMPLE_S``, the replica's (admitted cost by tenant, records queued by tenant)."""
    from ray import serve

    handle = serve.get_deployment_handle("LLMServer", app_name="fair")
    while not stop.wait(SAMPLE_S):
        batcher = handle.stats.remote().result(timeout_s=30)["batcher"]
        samples.append((batcher["admitted_cost_by_tenant"], batcher["queued_by_tenant"]))


def replica_shares(samples: list[tuple[dict[str, int], dict[str, int]]]) -> tuple[dict[str, float], float]:
    """Tokens admitted per job over the sampling intervals when both jobs had rows queued at the replica at
    both ends, and how many such intervals' seconds there were."""
    admitted = {"big": 0.0, "small": 0.0}
    intervals = 0
    for (before, queued_before), (after, queued_after) in itertools.pairwise(samples):
        if all(queued_before.get(job) and queued_after.get(job) for job in admitted):
            intervals += 1
            for job in admitted:
                admitted[job] += after.get(job, 0) - before.get(job, 0)
    return admitted, intervals * SAMPLE_S


def measure(fair: bool, big_rows: int, small_start_s: float) -> dict[str, Any]:
    """Deploy the app with ``fair_share: fair``, run the two jobs, and the shares while both ran."""
    from ray import serve

    from serve_app.app import build_app

    serve.run(build_app({**APP, "batcher": {"fair_share": fair}}), name="fair", route_prefix="/fair")
    log: list[tuple[float, str, int]] = []
    samples: list[tuple[dict[str, int], dict[str, int]]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(stop, samples))
    sampler.start()
    started = time.monotonic()
    big = threading.Thread(target=run_job, args=("big", big_rows, BIG_TOKENS, BIG_CONCURRENCY, log))
    big.start()
    time.sleep(small_start_s)  # the schedule: the second job starts this much later
    small_started = time.monotonic()
    run_job("small", SMALL_ROWS, SMALL_TOKENS, SMALL_CONCURRENCY, log)
    small_wall = time.monotonic() - small_started
    big.join()
    stop.set()
    sampler.join()
    serve.delete("fair")
    at_replica, both_queued_s = replica_shares(samples)
    replica_total = sum(at_replica.values()) or 1.0
    small_times = [t for t, job, _ in log if job == "small"]
    window = (small_started, max(small_times))
    inside = {job: sum(n for t, j, n in log if j == job and window[0] <= t <= window[1]) for job in ("big", "small")}
    total = sum(inside.values())
    big_done = max(t for t, job, _ in log if job == "big")
    return {
        "fair_share": fair,
        "both_queued_s": both_queued_s,
        "replica_small_share": at_replica["small"] / replica_total,
        "replica_small_vs_equal": at_replica["small"] / replica_total / 0.5,
        "window_s": window[1] - window[0],
        "big_share": inside["big"] / total,
        "small_share": inside["small"] / total,
        "small_vs_equal": inside["small"] / total / 0.5,
        "big_vs_equal": inside["big"] / total / 0.5,
        "small_wall_s": small_wall,
        "window_tok_s": total / (window[1] - window[0]),
        "total_tok_s": sum(n for _, _, n in log) / (big_done - started),
    }


COLUMNS = [
    ("peer", "peer", ""),
    ("both_queued_s", "both queued at the replica (s)", ".1f"),
    ("replica_small_share", "small job's share admitted then", ".2f"),
    ("replica_small_vs_equal", "x equal share", ".2f"),
    ("window_s", "both running at the driver (s)", ".1f"),
    ("small_share", "small job's output share at the driver", ".2f"),
    ("small_vs_equal", "x equal share", ".2f"),
    ("small_wall_s", "small job wall (s)", ".1f"),
    ("window_tok_s", "tok/s while both ran", ".0f"),
    ("total_tok_s", "tok/s over the run", ".0f"),
]


def markdown(rows: list[dict[str, Any]], big_rows: int, small_start_s: float, minutes: float) -> str:
    about = (
        f"One replica of the SIMULATED engine (10 ms + 0.1 ms a sequence per decode step, 32 sequences). A big "
        f"Ray Data job ({big_rows} prompts x {BIG_TOKENS} tokens, {BIG_CONCURRENCY} requests of 8 rows in "
        f"flight) and, {small_start_s:.0f} s later, a small one ({SMALL_ROWS} prompts x {SMALL_TOKENS} tokens, "
        f"{SMALL_CONCURRENCY} requests in flight), each its own tenant. At the replica: each job's tokens "
        "(prompt + max_tokens) admitted while both had rows queued there (the replica's statistics sampled every "
        f"{SAMPLE_S} s). At the driver: each job's output tokens returned from the small job's first row back "
        "to its last (ramp-up and tail included) over all returned then. An equal share is 0.50. "
        "`python -m benchmarks.fairness`."
    )
    title = "Two jobs on one replica: fair share off and on (simulated engine)"
    return page(title, about, rows, COLUMNS, [], minutes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="600 rows in the big job, the small one 10 s later")
    args = parser.parse_args(argv)
    big_rows, small_start_s = (600, 10.0) if args.quick else (BIG_ROWS, SMALL_START_S)
    from harness.environment import use_serve_env
    from harness.ports import free_port

    began = time.monotonic()
    use_serve_env()  # make serve's settings, before ray.serve is imported
    import ray
    from ray import serve

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    rows = []
    for peer, fair in PEERS.items():
        row = {"peer": peer, **measure(fair, big_rows, small_start_s)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    serve.shutdown()
    ray.shutdown()
    suffix = "-quick" if args.quick else ""
    text = markdown(rows, big_rows, small_start_s, (time.monotonic() - began) / 60)
    (RESULTS / f"fairness{suffix}.md").write_text(text)
    (RESULTS / f"fairness{suffix}.json").write_text(json.dumps({"rows": rows}, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
