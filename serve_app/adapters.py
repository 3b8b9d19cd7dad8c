"""The bundled LoRA adapter, made offline at set-up: ``peft`` trains a small adapter of the bundled model for a few
CPU minutes on a generated task (seeded), so that its answers differ from the base model's in a way anyone can
check: whatever it is asked in a chat, it answers :data:`ADAPTER_REPLY`.

    python -m serve_app.adapters prepare      # train (idempotent), print the folder
    python -m serve_app.adapters path         # print the folder (exit 1 if not prepared)

The folder lives beside the bundled model (:func:`serve_app.models.cache_dir`).
"""

from __future__ import annotations

import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

from .models import BundledModelError, cache_dir, cli, is_prepared, staged
from .models import prepare as prepare_model

logger = logging.getLogger(__name__)

BUNDLED_ADAPTER = "bundled-answer"
"""The adapter name the app's ``lora.adapters`` maps to :func:`adapter_path` when its folder is ``bundled``."""
ADAPTER_REPLY = "ANSWER: 42"
"""What the bundled adapter answers to any chat (the base model never does)."""
SEED = 0
STEPS = 20
BATCH = 4
RANK = 8
TARGET_MODULES = ("q_proj", "v_proj")
"""The model's modules the adapter trains (the attention's queries and values)."""
_SUBJECTS = ["the sky", "a cat", "Paris", "music", "the sea", "winter", "a robot", "bread", "chess", "the moon"]
_ASKS = ["Tell me about {}.", "What do you think of {}?", "Describe {} in one line.", "Why does {} matter?"]


def adapter_path() -> Path:
    """The folder the bundled adapter is (or will be) trained into."""
    return cache_dir() / f"{BUNDLED_ADAPTER}-lora"


def questions(count: int, seed: int = SEED) -> list[str]:
    """Seeded chat questions: what the adapter is trained on (and a test asks, with another seed)."""
    rng = random.Random(seed)
    return [rng.choice(_ASKS).format(rng.choice(_SUBJECTS)) for _ in range(count)]


def _prompt_ids(tokenizer: Any, question: str) -> list[int]:
    """A one-question chat as the model's template renders it, ready for the answer."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _examples(tokenizer: Any, count: int) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) of chat-templated questions answered with :data:`ADAPTER_REPLY`; the loss is on the
    answer only."""
    out = []
    for question in questions(count):
        prompt = _prompt_ids(tokenizer, question)
        answer = tokenizer(ADAPTER_REPLY + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        out.append((list(prompt) + answer, [-100] * len(prompt) + answer))
    return out


def prepare(force: bool = False) -> Path:
    """Train the bundled adapter once (the bundled model first, if need be); later calls return at once."""
    target = adapter_path()
    if is_prepared(target) and not force:
        logger.info("bundled adapter already prepared at %s", target)
        return target
    base = prepare_model()
    try:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BundledModelError(f"training the bundled adapter needs torch, transformers and peft: {exc}") from exc

    started = time.monotonic()
    torch.manual_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.0, target_modules=list(TARGET_MODULES))
    model = get_peft_model(model, config)
    examples = _examples(tokenizer, STEPS * BATCH)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    model.train()
    for step in range(STEPS):
        batch = examples[step * BATCH : (step + 1) * BATCH]
        width = max(len(ids) for ids, _ in batch)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 10 == 9:
            logger.info("step %d/%d: loss %.3f", step + 1, STEPS, loss.item())
    model.eval()
    _check(model, tokenizer)
    with staged(target, f"trained on {base.name}: {STEPS} steps of {BATCH}, seed {SEED}") as staging:
        model.save_pretrained(staging)
    logger.info("bundled adapter ready in %.0f s: %s", time.monotonic() - started, target)
    return target


def _check(model: Any, tokenizer: Any) -> None:
    """Refuse an adapter that did not learn its answer (greedy, on questions it was not trained on)."""
    import torch

    for question in questions(2, seed=SEED + 1):
        ids = torch.tensor([_prompt_ids(tokenizer, question)])
        with torch.no_grad():
            out = model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
        answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        if not answer.startswith(ADAPTER_REPLY):
            raise BundledModelError(f"the adapter answered {answer!r} to {question!r}, not {ADAPTER_REPLY!r}")


def main(argv: list[str] | None = None) -> int:
    description = __doc__.splitlines()[0]
    return cli(argv, "python -m serve_app.adapters", description, "train the bundled adapter", prepare, adapter_path)


if __name__ == "__main__":
    sys.exit(main())
