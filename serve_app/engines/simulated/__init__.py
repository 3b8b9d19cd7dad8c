"""The SIMULATED engine: no model, deterministic text, and time from a cost model. For tests and
benchmarks of the batching and serving logic only; it is never the default engine.

By default it batches continuously, as vLLM does: one stepper task advances every running sequence by one
token per step; a step takes ``step_s + step_s_per_seq * sequences + step_s_per_token * tokens in their
contexts + prefill_s_per_token * prompt tokens entering this step``; each sequence streams its tokens and
ends at its own length (``max_tokens``), freeing its place for the next (at most ``max_num_seqs`` run; the
rest wait in the engine's own queue). With ``prefix_caching`` a prompt's leading blocks still held from earlier
prompts skip their prefill, as in vLLM's prefix cache. With ``padded`` it is a static, padded batch engine instead:
a batch takes ``batch_overhead_s`` plus prefill and decode over batch size x the longest prompt and output.

Tokenization is simulated too: one token per 4 characters, or the model's own tokenizer (``tokenizer``), which
lets vLLM's output parsers read its replies. Replies echo the prompt's words (with simulated token ids), or say
a reply a prompt asks for by number (``replies``), token by token, and stop there.
"""

from .engine import SimulatedEngine

__all__ = ["SimulatedEngine"]
