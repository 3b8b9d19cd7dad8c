"""What the CPU this process runs on computes fastest: its feature flags and the dtype both vLLM engines and the
padded embedding engine use on it when their dtype is ``auto``."""

from __future__ import annotations

from collections.abc import Collection

NATIVE_BF16_FLAG = "amx_bf16"
"""The CPU flag (Linux's name) of bfloat16 matrix units: Intel Xeon from Sapphire Rapids on."""


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux lists them in /proc/cpuinfo (none where there is no such file)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def cpu_dtype(flags: Collection[str] | None = None) -> str:
    """The dtype ``auto`` means on a CPU: bfloat16 where the CPU multiplies it in hardware (AMX), float32 elsewhere,
    where bfloat16 is emulated and slower (about 6x for generation on an AVX2-only CPU, measured here). On 2
    Sapphire Rapids cores bfloat16 gave generation 2.1x the output tok/s of float32 (vLLM's CPU build, the bundled
    model, eager) and embeddings 1.9x the texts/s through vLLM's pooling runner and 1.5x through
    sentence-transformers (docs/cpu-tuning.md, docs/embeddings.md)."""
    return "bfloat16" if NATIVE_BF16_FLAG in (cpu_flags() if flags is None else flags) else "float32"
