"""A tiny random-weight Llama made at run time from the bundled model's config and tokenizer (seeded, nothing from a
hub): vLLM's CPU engine steps it in milliseconds, so the engine emits thousands of tokens a second, as a GPU does
with a real model, and the tokens are the bundled model's own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
}
"""What changes in the bundled model's ``config.json``: everything else (vocabulary, special tokens, rope, context
length) stays, so its tokenizer and chat template fit."""

WEIGHTS = (".safetensors", ".bin", ".pt", ".gguf")


def make_tiny_model(dest: Path, source: Path | None = None, seed: int = 0) -> Path:
    """Write the tiny model into ``dest`` (created): ``source``'s config with :data:`TINY` over it, random weights
    from ``seed``, and every file of ``source`` that is not a weight or the config (tokenizer, chat template,
    generation config). ``source`` defaults to the bundled model, prepared offline."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if source is None:
        from serve_app.models import prepare

        source = Path(prepare())
    config = json.loads((source / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ValueError(f"{source} is a {config.get('model_type')!r} model; the tiny model is made from a Llama")
    config.update(TINY)
    config["dtype"] = "float32"  # what a server reading the config computes in (the peers name theirs anyway)
    dest.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        if f.is_file() and f.name != "config.json" and not f.name.startswith(".") and f.suffix not in WEIGHTS:
            shutil.copy2(f, dest / f.name)
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(dest)
    return dest
