"""The prefix workload of the real-replica routing benchmark: closed-loop conversations, each group of them sharing a
long system prompt, each conversation's turns growing on its own history (what a chat product or an agent sends), and
the figures of their outcomes."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.stats import percentile

from ..lib.peers import DTYPE, MODEL_NAME
from .real_load import sse_chunks

CONVERSATIONS = 32
SHARING = 4  # conversations per system prompt
SYSTEM_TOKENS = 1_500
TURNS = 4  # then the conversation starts over, on the same system prompt
ANSWER_TOKENS = 24
VARIED_ANSWERS = (12, 36)
"""Output tokens of a turn under ``--varied-answers``, drawn per turn (seeded; the mean is ``ANSWER_TOKENS``): with
every answer alike, and no pause between turns, the conversations that start together stay in step, and each
replica takes its conversations' turns in waves."""
WORDS = ("river", "stone", "cloud", "paper", "light", "music", "garden", "window", "morning", "silver", "forest")


def system_prompts(folder: Path, seed: int = 7) -> list[str]:
    """``CONVERSATIONS / SHARING`` seeded system prompts of ``SYSTEM_TOKENS`` tokens of the bundled model each."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    rng = random.Random(seed)
    prompts = []
    for index in range(CONVERSATIONS // SHARING):
        words = " ".join(rng.choice(WORDS) for _ in range(SYSTEM_TOKENS * 2))
        ids = tokenizer(f"Rules of assistant {index}: {words}", add_special_tokens=False)["input_ids"]
        prompts.append(tokenizer.decode(ids[:SYSTEM_TOKENS]))
    return prompts


def cache_size(folder: Path, gib: float) -> str:
    """A KV cache of ``gib`` GiB for the model in ``folder``, in words: its GiB and about how many tokens it holds
    (keys and values of every layer, in the peers' dtype)."""
    config = json.loads((folder / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim
    per_token *= 4 if DTYPE == "float32" else 2
    return f"{gib:g} GiB (about {gib * (1 << 30) / per_token:,.0f} tokens)"


async def streamed(
    session: Any,
    url: str,
    body: dict[str, Any],
    start: float,
    read: Callable[[dict[str, Any], dict[str, Any]], str],
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """POST ``body`` to ``url`` and read its stream: each chunk's text (``read`` returns it, and notes in the
    outcome what else the chunk says: usage, an id, an error); the outcome's TTFT (first text), answer and times. A
    refusal, a dropped connection or an error ``read`` noted is a failed turn, counted as such."""
    sent = time.perf_counter()
    out: dict[str, Any] = {"sent": sent - start, "ok": False, "tokens": 0, "ttft": None, "text": ""}
    try:
        async with session.post(url, json=body, headers=headers) as response:
            if response.status != 200:
                out["error"] = f"{response.status}: {(await response.text())[:200]}"
                return out
            async for chunk in sse_chunks(response):
                text = read(chunk, out)
                if text and out["ttft"] is None:
                    out["ttft"] = time.perf_counter() - sent
                out["text"] += text
    except Exception as exc:
        out["error"] = repr(exc)[:200]
    if "error" not in out:
        out |= {"ok": True, "e2e": time.perf_counter() - sent, "done": time.perf_counter() - start}
    return out


def read_chat(chunk: dict[str, Any], out: dict[str, Any]) -> str:
    """A chat completion chunk's text; its usage (output and prompt tokens, those the prefix cache held) in ``out``."""
    if chunk.get("usage"):
        usage = chunk["usage"]
        out["tokens"], out["prompt_tokens"] = usage["completion_tokens"], usage.get("prompt_tokens")
        out["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return "".join((choice.get("delta") or {}).get("content") or "" for choice in chunk.get("choices", []))


def read_response(event: dict[str, Any], out: dict[str, Any]) -> str:
    """A Responses API stream event's text; the final response's usage and ``id`` (or the error) into ``out``."""
    kind = event.get("type")
    if kind in ("error", "response.failed"):
        out["error"] = json.dumps(event)[:200]
    if kind in ("response.completed", "response.incomplete"):  # incomplete: max_output_tokens reached
        usage, out["id"] = event["response"]["usage"], event["response"]["id"]
        out["tokens"], out["prompt_tokens"] = usage["output_tokens"], usage["input_tokens"]
        out["cached_tokens"] = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    return event["delta"] if kind == "response.output_text.delta" else ""


async def turn(
    session: Any,
    url: str,
    messages: list[dict[str, str]],
    start: float,
    conversation: str | None = None,
    max_tokens: int = ANSWER_TOKENS,
) -> dict[str, Any]:
    """One streamed chat turn of ``max_tokens``: its TTFT (first text), its answer, its output and prompt tokens and
    how many of those the peer's prefix cache held (usage's ``prompt_tokens_details``; None where not reported);
    ``conversation``: sent as Serve's session header (``x-session-id``), for the token router's session affinity."""
    body = {
        "model": MODEL_NAME,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"x-session-id": conversation} if conversation is not None else None
    return await streamed(session, f"{url}/v1/chat/completions", body, start, read_chat, headers)


async def responses_turn(
    session: Any, url: str, given: list[dict[str, str]], previous: str | None, start: float, max_tokens: int
) -> dict[str, Any]:
    """One streamed Responses API turn: ``given`` (the turn's new messages) after the stored response ``previous``
    (``previous_response_id``; the server holds the conversation so far); :func:`turn`'s figures, and the response's
    ``id`` for the next turn."""
    body = {"model": MODEL_NAME, "input": given, "max_output_tokens": max_tokens, "temperature": 0.0, "stream": True}
    body |= {"previous_response_id": previous} if previous else {}
    out = await streamed(session, f"{url}/v1/responses", body, start, read_response)
    if out["ok"] and "id" not in out:
        out |= {"ok": False, "error": "the stream ended without its response"}
    return out


CLIENTS = ("chat", "sessions", "responses")
"""How a conversation's turns are sent: chat completions with the whole conversation, the same with its own
``x-session-id``, or Responses API turns that name the response before (the server holds the conversation)."""


async def conversations(
    url: str, systems: list[str], load_s: float, seed: int = 3, client: str = "chat", varied: bool = False
) -> list[dict[str, Any]]:
    """``CONVERSATIONS`` clients, each one conversation at a time on its group's system prompt, turn after turn,
    until ``load_s`` has passed; every turn's outcome. ``client``: one of :data:`CLIENTS`; ``varied``: each answer's
    length drawn from ``VARIED_ANSWERS``, not ``ANSWER_TOKENS``."""
    import aiohttp

    outcomes: list[dict[str, Any]] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=900)) as session:
        start = time.perf_counter()

        async def converse(index: int) -> None:
            rng = random.Random(seed * 1000 + index)
            system = systems[index // SHARING]
            started = 0
            while time.perf_counter() - start < load_s:
                messages = [{"role": "system", "content": system}]
                conversation = f"client-{index}-conversation-{started}" if client == "sessions" else None
                started += 1
                previous = None  # the Responses client's: the response its next turn continues
                for number in range(TURNS):
                    question = " ".join(rng.choice(WORDS) for _ in range(12))
                    messages.append({"role": "user", "content": f"Turn {number} of client {index}: {question}?"})
                    answer = rng.randint(*VARIED_ANSWERS) if varied else ANSWER_TOKENS
                    if client == "responses":
                        given = messages if previous is None else messages[-1:]
                        outcome = await responses_turn(session, url, given, previous, start, answer)
                        previous = outcome.get("id")
                    else:
                        outcome = await turn(session, url, messages, start, conversation, answer)
                    outcomes.append({**outcome, "turn": number, "client": index})
                    if not outcome["ok"] or time.perf_counter() - start >= load_s:
                        break
                    messages.append({"role": "assistant", "content": outcome["text"]})

        await asyncio.gather(*(converse(i) for i in range(CONVERSATIONS)))
    return outcomes


REQUEST_FIELDS = ("ok", "client", "turn", "sent", "ttft", "e2e", "done", "tokens", "prompt_tokens", "cached_tokens")


def cache_hit_rate(turns: list[dict[str, Any]]) -> float:
    """The share of the turns' prompt tokens the peer's prefix caches held (NaN where a turn's usage reported
    none)."""
    if not turns or any(t.get("cached_tokens") is None for t in turns):
        return float("nan")
    return sum(t["cached_tokens"] for t in turns) / sum(t["prompt_tokens"] for t in turns)


def summarize(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [o for o in outcomes if o["ok"]]
    ttfts = [o["ttft"] for o in ok if o["ttft"] is not None]
    later = [o["ttft"] for o in ok if o["ttft"] is not None and o["turn"] > 0]
    span = max(o["done"] for o in ok) - min(o["sent"] for o in outcomes)
    return {
        "sent": len(outcomes),
        "failed": len(outcomes) - len(ok),
        "errors": sorted({o["error"] for o in outcomes if not o["ok"]})[:3],
        "output_tok_s": sum(o["tokens"] for o in ok) / span,
        "turns_s": len(ok) / span,
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p99_s": percentile(ttfts, 99),
        "later_ttft_p50_s": statistics.median(later) if later else float("nan"),
        "cache_hit_rate": cache_hit_rate(ok),
    }
