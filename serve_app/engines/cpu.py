"""What the CPU this process runs on computes fastest (its feature flags and the dtype both vLLM engines and the
padded embedding engine use on it when their dtype is ``auto``), and how the processes beside a CPU engine's
compute threads yield them the cores."""

from __future__ import annotations

import os
from collections.abc import Collection

from .procs import descendants, process_table

NATIVE_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
"""CPU flags (Linux's names) of bfloat16 multiplication in hardware: AMX's matrix units (Intel Xeon from Sapphire
Rapids on) and AVX-512's bfloat16 dot products (AMD from Zen 4 on, Intel Xeon from Cooper Lake on)."""


def cpuinfo_field(key: str) -> str | None:
    """The first value of ``key`` in /proc/cpuinfo (``flags``, ``model name``); None where there is none."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux lists them in /proc/cpuinfo (none where there is no such file)."""
    return frozenset((cpuinfo_field("flags") or "").split())


def cpu_dtype(flags: Collection[str] | None = None) -> str:
    """The dtype ``auto`` means on a CPU: bfloat16 where the CPU multiplies it in hardware (AMX or AVX512-BF16),
    float32 elsewhere, where bfloat16 is emulated and several times slower (docs/cpu-tuning.md and docs/embeddings.md
    hold what each gave here)."""
    return "float32" if NATIVE_BF16_FLAGS.isdisjoint(cpu_flags() if flags is None else flags) else "bfloat16"


def yield_cores(niceness: int) -> None:
    """Run this process at ``niceness`` from now on (never lower than it is: that needs privileges). Linux
    keeps a niceness per thread, so each thread is set; threads started later inherit their creator's. The
    engine processes already started keep theirs."""
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # no /proc (not Linux): niceness is per process there
        threads = [0]
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, max(niceness, os.getpriority(os.PRIO_PROCESS, tid)))
        except OSError:  # a thread that ended meanwhile
            continue


GLOO_LOOP_THREAD = "gloo_tcp_loop"
"""The kernel name of torch's gloo transport threads: one per process group, and vLLM makes 13 in each worker."""


def idle_gloo_threads(root: int | None = None) -> int:
    """Run the gloo transport threads of every process below ``root`` (default: this one) at ``SCHED_IDLE``; how
    many were set. Linux only (elsewhere: 0).

    Why: vLLM's worker makes a gloo process group for each parallel group even with one worker, and each group's
    transport thread wakes every 10 ms (``epoll_wait``'s timeout in gloo's loop) with nothing to carry: about
    1,300 wake-ups a second in one worker. On a CPU each takes a core from one of the model's compute threads,
    and the whole step waits for that thread: they were the largest single cause of the compute threads'
    preemptions (2 cores, one text a request to the embedding app: 310 of about 1,400 a second). At
    ``SCHED_IDLE`` a waking thread no longer preempts the model: it waits for a free core or its small share of
    one (the same load: 65-170 of theirs a second, +7.7% texts/s)."""
    if not hasattr(os, "SCHED_IDLE"):
        return 0
    table = process_table()
    count = 0
    for pid in descendants(table, [os.getpid() if root is None else root]):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as comm:
                    if comm.read().strip() != GLOO_LOOP_THREAD:
                        continue
                os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
                count += 1
            except OSError:
                continue
    return count
