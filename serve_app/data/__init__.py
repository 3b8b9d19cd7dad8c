"""Ray Data batch inference: stream a whole dataset through the Serve apps, or through a core held in process.

    import ray
    from serve_app.data import generate

    ds = ray.data.read_json("problems.jsonl", lines=True)
    out = generate(ds, app="llm", prompt_column="prompt", max_tokens=64)   # lazy; one row out per row in
    out.write_json("out/")

Conversations go through the same app as chat completions (``chat``): a ``messages`` column (OpenAI's messages,
a list or JSON text) and the same chat fields for every row (``tools=[...]``, ``tool_choice``, ``max_tokens``); each
row gains ``content``, ``tool_calls`` and ``reasoning`` beside a generation's columns.

Embedding a corpus works the same way through the embedding app (``embed``), or in process
(``InProcessEmbed``): each row gains ``embedding`` (a list of floats; null where it failed), ``tokens`` and
``error``, and ``write_parquet`` stores the vectors as a list column.

Resumable jobs: ``generate(ds, ..., checkpoint="ckpt/")`` (or ``checkpointed(ds, "ckpt/")`` before an in-process
``map_batches``) records the ids of written rows, and the same job run again skips them; ``read(path,
id_column="id")`` numbers rows that have no id (``"<file>:<row>"``).

Names are imported when first used (PEP 562): a job's map actor imports its own module (``actors``) without the
in-process cores' engines."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .actors import RowFailedError, ServeChat, ServeEmbed, ServeGenerate
    from .in_process import InProcessEmbed, InProcessGenerate
    from .jobs import (
        DATA_PRIORITY,
        DEFAULT_BATCH_SIZE,
        EMBED_BATCH_SIZE,
        actor_pool,
        app_capacity,
        chat,
        embed,
        generate,
        job_blocks,
    )
    from .resume import checkpointed, read

__all__ = [
    "DATA_PRIORITY",
    "DEFAULT_BATCH_SIZE",
    "EMBED_BATCH_SIZE",
    "InProcessEmbed",
    "InProcessGenerate",
    "RowFailedError",
    "ServeChat",
    "ServeEmbed",
    "ServeGenerate",
    "actor_pool",
    "app_capacity",
    "chat",
    "checkpointed",
    "embed",
    "generate",
    "job_blocks",
    "read",
]

_MODULES = {  # the rest are in .jobs
    "InProcessEmbed": "in_process",
    "InProcessGenerate": "in_process",
    "RowFailedError": "actors",
    "ServeChat": "actors",
    "ServeEmbed": "actors",
    "ServeGenerate": "actors",
    "checkpointed": "resume",
    "read": "resume",
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULES.get(name, 'jobs')}", __name__), name)
