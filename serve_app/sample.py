"""A sample dataset the project makes itself (no hub): arithmetic word problems of varied length with
known answers, so a batch-inference run can also report accuracy.

    python -m serve_app.sample --rows 200 --output data/problems.jsonl

Each row: ``{"id": int, "prompt": str, "answer": int}``. Lengths vary from one line to a paragraph of
distracting context, so token-aware and length-aware batching have something to work with.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

NAMES = ["Ada", "Ben", "Chloe", "Dmitri", "Emeka", "Fatima", "Grace", "Hiro", "Ines", "Jonas"]
THINGS = ["apples", "marbles", "books", "stamps", "shells", "coins", "pencils", "stickers"]
FILLER = [
    "It was a bright morning and the market was busy.",
    "Everyone in town had been talking about the fair for weeks.",
    "The weather report had promised rain, but the sky stayed clear.",
    "A small dog followed them for most of the way, wagging its tail.",
    "They had agreed to meet by the old clock tower at nine.",
    "Nobody remembered who had first suggested the trip.",
]


def problem(rng: random.Random, index: int) -> dict[str, object]:
    """One word problem with its integer answer."""
    name, other = rng.sample(NAMES, 2)
    thing = rng.choice(THINGS)
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    kind = rng.choice(["add", "sub", "mul"])
    if kind == "add":
        story, answer = f"{name} has {a} {thing}. {other} gives {name} {b} more {thing}.", a + b
        question = f"How many {thing} does {name} have now?"
    elif kind == "sub":
        a, b = max(a, b), min(a, b)
        story, answer = f"{name} has {a} {thing} and gives {b} of them to {other}.", a - b
        question = f"How many {thing} does {name} have left?"
    else:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        story, answer = f"{name} packs {a} boxes with {b} {thing} in each box.", a * b
        question = f"How many {thing} did {name} pack in all?"
    context = " ".join(rng.sample(FILLER, rng.choice([0, 0, 1, 2, 4, 6])))
    text = f"{context} {story} {question}".strip()
    prompt = f"Solve the problem and give the answer as a number.\nProblem: {text}\nAnswer:"
    return {"id": index, "prompt": prompt, "answer": answer}


def make(rows: int, seed: int = 0) -> list[dict[str, object]]:
    """``rows`` problems, reproducibly."""
    rng = random.Random(seed)
    return [problem(rng, i) for i in range(rows)]


def write(path: Path, rows: int, seed: int = 0) -> Path:
    """Write ``rows`` problems to ``path`` as JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for row in make(rows, seed):
            fh.write(json.dumps(row) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve_app.sample", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=Path("data/problems.jsonl"))
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error("--rows must be >= 1")
    print(write(args.output, args.rows, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
