"""Batch jobs on the bundled model: the same prompts of the sample dataset, greedy, ``max_tokens`` 32, each way a
Ray user runs such a job (each peer in a process of its own, one engine on the CPU at a time):

  offline        vLLM's ``LLM.generate`` over every prompt at once: the ceiling, timed around ``generate`` alone
  offline-all-cores  the same with every core computing (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``, what
                 ``vllm.cpu_reserved_cores: 0`` gives the app's engine); vLLM's default keeps one core for its scheduler
  ray-data-llm   Ray Data LLM, what a Ray user picks: ``build_processor`` with ``vLLMEngineProcessorConfig``
                 (``batch_size`` 64 and one engine, as its docs show; its engine on one CPU bundle), start-up included
  in-process     this project's ``InProcessGenerate`` in ``map_batches`` (one generation core in one map actor,
                 serve_config.yaml's args), start-up included
  deployment     this project's driver (``python -m serve_app.driver``) into ``serve run serve_config.yaml``'s app,
                 its engine already up: the driver's wall from the first row read to the last row written (Ray
                 Data's start included), and the replica's utilization over the job (the driver's summary)
  resume         the same driver job killed (SIGKILL) once about half its rows are written, then run again with
                 ``--resume``: the rows the rerun processed against those left unwritten, duplicate ids in the output

Both Ray Data peers run Ray's workers at nice 0 (``serve.env``, as the app does). Reported: output tokens (greedy:
the same wherever the same model runs the same way), wall, output tok/s and its ratio to offline, and in-process
against ray-data-llm.

    python -m benchmarks.batch_jobs [--quick] [--peers offline deployment ...]   # results/batch_jobs[-quick].{md,json}
    python -m benchmarks.batch_jobs --peers offline deployment --app-vllm '{"max_num_seqs": 256}'  # the app's engine
                                                                                    # settings changed
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.environment import ROOT, last_error, serve_env

from .e2e.direct import run_offline
from .e2e.settings import app_args, engine_settings, prompts
from .lib.peers import ALL_CORES, env
from .lib.report import RESULTS, page
from .serving.peers import driver_call, run_driver, running

PEERS = ("offline", "offline-all-cores", "ray-data-llm", "in-process", "deployment", "resume")
OWN_PROCESS = PEERS[:4]
ROWS = {"full": 2000, "quick": 500}
MAX_TOKENS = 32
IN_PROCESS_BATCH, IN_PROCESS_CALLS = 16, 16  # 256 rows in the actor: its batcher keeps vLLM's 128 running
COLUMNS = [
    ("peer", "peer", ""),
    ("rows", "rows", "d"),
    ("output_tokens", "output tokens", "d"),
    ("wall_s", "wall s", ".1f"),
    ("output_tokens_per_s", "output tok/s", ".1f"),
    ("vs_offline", "x offline", ".2f"),
    ("utilization", "replica utilization", ".3f"),
    ("note", "note", ""),
]


def write_input(rows: int, path: Path) -> Path:
    """The first ``rows`` prompts of the sample dataset (seed 0, as every peer reads them), with ids, as JSONL."""
    path.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(prompts(rows))))
    return path


def ray_data_llm(texts: list[str], out: Path) -> dict[str, Any]:
    """Ray Data LLM over ``texts``; wall from building the processor to the last row written."""
    import ray
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    from serve_app.models import prepare

    settings = engine_settings()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    started = time.perf_counter()
    config = vLLMEngineProcessorConfig(
        model_source=str(prepare()),
        engine_kwargs=settings,
        placement_group_config={"bundles": [{"CPU": 1}], "strategy": "PACK"},
        chat_template_stage=False,
        batch_size=64,
        concurrency=1,
    )
    sampling = {"temperature": 0.0, "max_tokens": MAX_TOKENS}
    processor = build_processor(
        config,
        preprocess=lambda row: {"id": row["id"], "prompt": row["prompt"], "sampling_params": sampling},
        postprocess=lambda row: {"id": row["id"], "text": row["generated_text"], "tokens": row["num_generated_tokens"]},
    )
    processor(ray.data.from_items([{"id": i, "prompt": t} for i, t in enumerate(texts)])).write_parquet(str(out))
    wall = time.perf_counter() - started
    return {"wall_s": wall, **read_back(out, "tokens")}


def in_process(texts: list[str], out: Path) -> dict[str, Any]:
    """This project's ``InProcessGenerate`` over ``texts``; wall from building the dataset to the last row written."""
    import ray

    from serve_app.data import InProcessGenerate
    from serve_app.models import prepare

    prepare()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    started = time.perf_counter()
    ray.data.from_items([{"id": i, "prompt": t} for i, t in enumerate(texts)]).map_batches(
        InProcessGenerate,
        fn_constructor_kwargs={"config": app_args(), "sampling": {"max_tokens": MAX_TOKENS, "temperature": 0.0}},
        batch_size=IN_PROCESS_BATCH,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=1, max_concurrent_calls_per_actor=IN_PROCESS_CALLS),
        num_cpus=1,
    ).write_parquet(str(out))
    wall = time.perf_counter() - started
    return {"wall_s": wall, **read_back(out, "output_tokens")}


def read_back(out: Path, tokens: str) -> dict[str, Any]:
    """Rows, output tokens and failed rows of a written Parquet output."""
    import pyarrow.parquet as pq

    table = pq.read_table(str(out))
    failed = table.num_rows - table.column("error").null_count if "error" in table.column_names else 0
    return {"rows": table.num_rows, "output_tokens": int(sum(table.column(tokens).to_pylist())), "failed": failed}


def one_peer(peer: str, rows: int) -> dict[str, Any]:
    """One of :data:`OWN_PROCESS`, in this process."""
    texts = prompts(rows)
    if peer.startswith("offline"):
        done = run_offline(texts, MAX_TOKENS, 1)
        return {**done, "rows": rows, "failed": 0, "note": "timed around generate() alone"}
    with tempfile.TemporaryDirectory() as tmp:
        done = (ray_data_llm if peer == "ray-data-llm" else in_process)(texts, Path(tmp) / "out")
    return {**done, "note": "start-up included"}


def in_own_process(peer: str, rows: int) -> dict[str, Any]:
    """:func:`one_peer` in a process of its own (the Ray Data peers with the app's Ray settings)."""
    argv = [sys.executable, "-m", "benchmarks.batch_jobs", "--one", peer, "--rows", str(rows)]
    cores = ALL_CORES if peer == "offline-all-cores" else {}
    done = subprocess.run(argv, cwd=ROOT, env={**env(), **serve_env(), **cores}, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError((done.stderr or done.stdout)[-3000:])
    return json.loads(lines[-1])


def written_rows(out: Path) -> int:
    """Rows the driver has written so far (its JSONL output files' lines)."""
    return sum(f.read_bytes().count(b"\n") for f in out.glob("*.json*")) if out.is_dir() else 0


def deployment_peers(
    peers: list[str], path: Path, rows: int, workdir: Path, measured: list[dict[str, Any]], vllm: dict[str, Any]
) -> None:
    """The driver job (and the resume run) into the app (``vllm``: settings over its engine's), started once, its
    engine up before the first job; each row appended to ``measured`` as it is done."""
    from serve_app.models import prepare

    fleet = {"embeddings_app": None, **({"vllm": vllm} if vllm else {})}
    with running("app", prepare(), workdir, 900, fleet=fleet) as (_url, startup_s, ray_tmp):
        job = ["--input", str(path), "--max-tokens", str(MAX_TOKENS)]
        if "deployment" in peers:
            summary = run_driver(ray_tmp, [*job, "--output", str(workdir / "out")])
            measured.append(
                {
                    "peer": "deployment",
                    "rows": summary["rows_out"],
                    "failed": summary["errors"],
                    "output_tokens": summary["output_tokens"],
                    "wall_s": summary["wall_s"],
                    "utilization": summary["batching"]["utilization"],
                    "note": f"engine up before (app start-up {startup_s:.0f} s)"
                    + (f"; vllm: {json.dumps(vllm)}" if vllm else ""),
                }
            )
        if "resume" in peers:
            measured.append(resume(ray_tmp, job, rows, workdir / "resumed"))


def resume(ray_tmp: str, job: list[str], rows: int, out: Path) -> dict[str, Any]:
    """The job killed once about half its rows are written, then resumed; what the rerun did."""
    call = driver_call(ray_tmp, [*job, "--output", str(out)])
    first = subprocess.Popen(**call, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while written_rows(out) < rows // 2 and first.poll() is None:
        time.sleep(0.2)
    ended = first.poll() is not None
    first.send_signal(signal.SIGKILL)
    first.wait()
    unwritten = rows - written_rows(out)
    if ended or not unwritten:
        raise RuntimeError(f"the first run ended with {unwritten} of {rows} rows unwritten before it could be killed")
    summary = run_driver(ray_tmp, [*job, "--output", str(out), "--resume"])
    processed = summary["rows_in"] - summary["rows_skipped"]
    return {
        "peer": "resume",
        "rows": summary["rows_out"],
        "failed": summary["errors"],
        "output_tokens": summary["output_tokens"],
        "wall_s": summary["wall_s"],
        "utilization": summary["batching"]["utilization"],
        "note": f"killed with {unwritten} rows unwritten; the rerun processed {processed}, "
        f"{summary['duplicate_ids']} duplicate ids in the output",
        "unwritten": unwritten,
        "processed": processed,
        "duplicate_ids": summary["duplicate_ids"],
    }


def measure(peers: list[str], rows: int, vllm: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every peer asked for, in order; a peer that fails is reported as failed with its reason."""
    measured = []
    with tempfile.TemporaryDirectory(prefix="batch_jobs") as tmp:
        workdir = Path(tmp)
        path = write_input(rows, workdir / "prompts.jsonl")
        for peer in [p for p in peers if p in OWN_PROCESS]:
            try:
                measured.append({"peer": peer, **in_own_process(peer, rows)})
            except RuntimeError as exc:
                measured.append({"peer": peer, "error": last_error(str(exc))})
            print(json.dumps(measured[-1]), flush=True)
        if {"deployment", "resume"} & set(peers):
            try:
                deployment_peers(peers, path, rows, workdir, measured, vllm or {})
            except RuntimeError as exc:
                done = {r["peer"] for r in measured}
                failed = next(p for p in ("deployment", "resume") if p in peers and p not in done)
                measured.append({"peer": failed, "error": last_error(str(exc)), "error_tail": str(exc)[-6000:]})
            print(json.dumps(measured[-1]), flush=True)
    ceiling = next((r for r in measured if r["peer"] == "offline" and "error" not in r), None)
    for row in measured:
        if "error" in row:
            continue
        resumed = row["peer"] == "resume"  # its wall is the rerun's, over the rows left; its tokens are the output's
        row["output_tokens_per_s"] = row["output_tokens"] / row["wall_s"] if row["wall_s"] and not resumed else math.nan
        row["vs_offline"] = row["output_tokens_per_s"] / ceiling["output_tokens_per_s"] if ceiling else math.nan
        row.setdefault("utilization", math.nan)
    return measured


def report(measured: list[dict[str, Any]], rows: int, minutes: float) -> str:
    ok = [r for r in measured if "error" not in r]
    notes = [f"- {r['peer']} failed: {r['error']}" for r in measured if "error" in r]
    by = {r["peer"]: r for r in ok}
    if "in-process" in by and "ray-data-llm" in by:
        ratio = by["in-process"]["output_tokens_per_s"] / by["ray-data-llm"]["output_tokens_per_s"]
        notes.append(f"- in-process / ray-data-llm (start-up included in both): **{ratio:.2f}x** output tok/s.")
    if "deployment" in by and "offline-all-cores" in by:
        ratio = by["deployment"]["output_tokens_per_s"] / by["offline-all-cores"]["output_tokens_per_s"]
        notes.append(f"- deployment / offline-all-cores (`LLM.generate` on every core): **{ratio:.2f}x** output tok/s.")
    notes += [f"- {r['peer']}: {r['failed']} rows failed." for r in ok if r.get("failed")]
    about = (
        f"`python -m benchmarks.batch_jobs`: {rows} prompts of the sample dataset, greedy, max_tokens {MAX_TOKENS}, "
        "each peer alone on the machine. x offline: output tok/s against `LLM.generate` timed around `generate` "
        "alone. Replica utilization: the fraction of the job's time the replica's engine had work."
    )
    return page("Batch jobs", about, ok, COLUMNS, [*notes, ""], minutes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{ROWS['quick']} prompts instead of {ROWS['full']}")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--rows", type=int, help="prompts (default: by --quick)")
    parser.add_argument("--app-vllm", type=json.loads, default={}, help="JSON: the app's vllm settings over its own")
    parser.add_argument("--one", choices=OWN_PROCESS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rows = args.rows or ROWS["quick" if args.quick else "full"]
    if args.one:
        print(json.dumps(one_peer(args.one, rows)))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.time()
    measured = measure(args.peers, rows, args.app_vllm)
    name = f"batch_jobs{'-quick' if args.quick else ''}"
    (RESULTS / f"{name}.json").write_text(json.dumps(measured, indent=2))
    (RESULTS / f"{name}.md").write_text(report(measured, rows, (time.time() - started) / 60))
    print((RESULTS / f"{name}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
