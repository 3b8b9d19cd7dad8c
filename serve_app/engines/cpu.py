"""What the CPU this process runs on computes fastest: its feature flags and the dtype both vLLM engines and the
padded embedding engine use on it when their dtype is ``auto``."""

from __future__ import annotations

from collections.abc import Collection

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
    float32 elsewhere, where bfloat16 is emulated and slower (about 6x for generation on an AVX2-only CPU, measured
    here). Against float32 on 2 cores (vLLM's CPU build, the bundled models, eager), bfloat16 gave on Sapphire
    Rapids (AMX) generation 2.1x the output tok/s and embeddings 1.9x the texts/s through vLLM's pooling runner and
    1.5x through sentence-transformers; on AMD EPYC Zen 4 (AVX512-BF16) 1.6x, 1.4x and 1.7x (docs/cpu-tuning.md,
    docs/embeddings.md)."""
    return "float32" if NATIVE_BF16_FLAGS.isdisjoint(cpu_flags() if flags is None else flags) else "bfloat16"
