"""Ray Data batch inference: stream a whole dataset through the Serve apps, or through a core held in process.

    import ray
    from serve_app.data import generate

    ds = ray.data.read_json("problems.jsonl", lines=True)
    out = generate(ds, app="llm", prompt_column="prompt", max_tokens=64)   # lazy; one row out per row in
    out.write_json("out/")

Embedding a corpus works the same way through the embedding app (``embed``), or in process
(``InProcessEmbed``): each row gains ``embedding`` (a list of floats; null where it failed), ``tokens`` and
``error``, and ``write_parquet`` stores the vectors as a list column.
"""

from .in_process import InProcessEmbed, InProcessGenerate
from .jobs import (
    DATA_PRIORITY,
    DEFAULT_BATCH_SIZE,
    EMBED_BATCH_SIZE,
    RowFailedError,
    ServeEmbed,
    ServeGenerate,
    actor_pool,
    app_capacity,
    embed,
    generate,
)

__all__ = [
    "DATA_PRIORITY",
    "DEFAULT_BATCH_SIZE",
    "EMBED_BATCH_SIZE",
    "InProcessEmbed",
    "InProcessGenerate",
    "RowFailedError",
    "ServeEmbed",
    "ServeGenerate",
    "actor_pool",
    "app_capacity",
    "embed",
    "generate",
]
