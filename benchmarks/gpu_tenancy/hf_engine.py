"""transformers' continuous-batching engine for the GPU benchmarks: a real engine where vLLM cannot travel.

The GPU machine some sessions are lent has torch and transformers, but neither Ray nor vLLM (whose wheel pins
another torch). ``ContinuousBatchingManager`` is a real continuous-batching engine (paged attention; each step
runs the decodes, then prefills in arrival order within its token budget): :class:`Engine` puts an async stream
per request in front of it, optionally with its waiting queue in priority order (vLLM's
``--scheduling-policy priority``). The model is a Qwen2-shaped decoder with random weights (timing only).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

SHAPES: dict[str, dict[str, int]] = {  # Qwen2 configs' sizes; "tiny" is for a CPU smoke run
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 1024},
    "qwen2.5-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936},
    "qwen2.5-1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936},
    "qwen2.5-7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064},
}  # fmt: skip


@dataclass
class Request:
    """One prompt (token ids) for the engine: what the replica's batcher sees of a chat or a job's row."""

    ids: list[int]
    max_new_tokens: int
    priority: int = 0
    stream: bool = False

    def estimate_tokens(self) -> int:
        return len(self.ids) + self.max_new_tokens  # what its KV cache holds at the end: the replica's cost


def build_model(shape: str, device: str) -> Any:
    """A Qwen2-shaped causal LM with random weights (bf16 on a GPU), built on ``device``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=False)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    return model.eval()


def step_times(
    model: Any, device: str, prompt: int, batches: tuple[int, ...] = (1, 16, 64, 256), past: int = 256
) -> list:
    """Milliseconds for one decode step (one new token per sequence over ``past`` cached) and one prefill of
    ``batch`` x ``prompt`` tokens, per batch size: how the model's step grows with its tokens."""
    import torch
    from transformers import DynamicCache

    def timed(fn: Any) -> float:
        fn()  # warm
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        sync()
        began = time.perf_counter()
        for _ in range(5):
            fn()
        sync()
        return (time.perf_counter() - began) / 5 * 1000

    rows = []
    with torch.no_grad():
        for batch in batches:
            ids = torch.randint(0, model.config.vocab_size, (batch, past + 1), device=device)
            cache = DynamicCache(config=model.config)
            model(ids[:, :past], past_key_values=cache, logits_to_keep=1)
            step, prompts = ids[:, past:], ids[:, :prompt]
            decode = timed(lambda c=cache, s=step: (model(s, past_key_values=c, logits_to_keep=1), c.crop(-1)))
            prefill = timed(lambda p=prompts: model(p, use_cache=False, logits_to_keep=1))
            rows.append({"batch": batch, "decode_ms": round(decode, 2), "prefill_ms": round(prefill, 2)})
    return rows


def priority_scheduler(priorities: dict[str, int]) -> type:
    """transformers' FIFO scheduler with its waiting queue in priority order (lower first, FIFO within one), as
    vLLM's ``--scheduling-policy priority`` orders its own; a request's priority is ``priorities[request_id]``
    (0 if absent). The engine picks its scheduler by name, so this one is registered as ``"priority"``."""
    from transformers.generation.continuous_batching.scheduler import SCHEDULER_MAPPING, FIFOScheduler

    class PriorityScheduler(FIFOScheduler):
        def _get_waiting_candidates(self) -> list:
            order = super()._get_waiting_candidates()
            return sorted(order, key=lambda state: priorities.get(state.request_id, 0))

    SCHEDULER_MAPPING["priority"] = PriorityScheduler
    return PriorityScheduler


class Engine:
    """transformers' continuous-batching engine behind an async stream per request (its outputs as they come);
    its waiting queue in the requests' priority order while ``priorities_on`` (else FIFO)."""

    def __init__(self, model: Any, kv_tokens: int, step_tokens: int, max_seqs: int) -> None:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        self.priorities_on = False
        self._priorities: dict[str, int] = {}  # request id -> priority, read by its scheduler
        priority_scheduler(self._priorities)  # the manager started below builds its scheduler from it

        page_size = 256
        cb = ContinuousBatchingConfig(
            page_size=page_size,
            num_blocks=math.ceil(kv_tokens / page_size),
            max_batch_tokens=step_tokens,
            max_requests_per_batch=max_seqs,
            allow_block_sharing=False,  # random prompts share nothing
            scheduler_type="priority",
        )
        generation = GenerationConfig(do_sample=False, eos_token_id=-1, max_new_tokens=256)  # each request sets its own
        self._manager = model.init_continuous_batching(generation_config=generation, continuous_batching_config=cb)
        self._manager.start()
        self._count = 0

    async def stream(self, request: Request) -> AsyncIterator[int]:
        """Yield the tokens generated so far at each output (one at the end unless ``request.stream``)."""
        outputs: asyncio.Queue = asyncio.Queue()
        self._count += 1
        request_id = f"r{self._count}"
        self._manager.register_result_handler(request_id, outputs.put_nowait)
        if self.priorities_on:
            self._priorities[request_id] = request.priority
        self._manager.add_request(
            request.ids, request_id=request_id, max_new_tokens=request.max_new_tokens, streaming=request.stream
        )
        try:
            while True:
                output = await outputs.get()
                if output.error:
                    raise RuntimeError(f"engine failed {request_id}: {output.error}")
                yield len(output.generated_tokens)
                if output.is_finished():
                    return
        except asyncio.CancelledError:
            self._manager.cancel_request(request_id)
            raise
        finally:
            self._priorities.pop(request_id, None)

    def stop(self) -> None:
        self._manager.stop(block=True)
