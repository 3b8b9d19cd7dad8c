"""Rows out of a ``map_batches`` call: the input columns plus each row's result columns, with their Arrow types."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

GENERATE_COLUMNS: dict[str, Any] = {
    "text": pa.string(),
    "prompt_tokens": pa.int64(),
    "output_tokens": pa.int64(),
    "finish_reason": pa.string(),
    "error": pa.string(),
}
"""What a generation job adds to each row."""

_LOGPROB = [("token", pa.string()), ("logprob", pa.float64())]
LOGPROBS_TYPE = pa.list_(pa.struct([*_LOGPROB, ("token_id", pa.int64()), ("top", pa.list_(pa.struct(_LOGPROB)))]))
"""A row's ``logprobs``: one ``{token, logprob, token_id, top}`` per generated token, ``top`` its alternatives'
``{token, logprob}``; its ``prompt_logprobs`` the same per prompt token (the first one's ``logprob`` null)."""


def generate_columns(sampling: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a generation job with this sampling adds to each row: :data:`GENERATE_COLUMNS`, and ``logprobs`` and
    ``prompt_logprobs`` where the sampling asks for them (null in a failed row)."""
    asked = [name for name in ("logprobs", "prompt_logprobs") if (sampling or {}).get(name) is not None]
    return {**GENERATE_COLUMNS, **dict.fromkeys(asked, LOGPROBS_TYPE)} if asked else GENERATE_COLUMNS


TOOL_CALLS_TYPE = pa.list_(
    pa.struct(
        [
            ("id", pa.string()),
            ("type", pa.string()),
            ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
        ]
    )
)
"""A row's ``tool_calls``: OpenAI's shape, the arguments as JSON text."""

CHAT_COLUMNS: dict[str, Any] = {
    **{name: kind for name, kind in GENERATE_COLUMNS.items() if name != "error"},
    "content": pa.string(),
    "tool_calls": TOOL_CALLS_TYPE,
    "reasoning": pa.string(),
    "error": pa.string(),
}
"""What a chat job adds to each row: a generation's columns (``text``: the whole output) and the answer read as a
chat completion's message (``content``, ``tool_calls``, ``reasoning``: null where there is none)."""

EMBED_COLUMNS: dict[str, Any] = {"embedding": pa.list_(pa.float64()), "tokens": pa.int64(), "error": pa.string()}
"""What an embedding job adds to each row."""


def texts(batch: dict[str, np.ndarray], column: str) -> list[str]:
    """The batch's input column as strings (a null as the empty string, which validation refuses in its row)."""
    return [str(value) if value is not None else "" for value in _column(batch, column)]


def conversations(batch: dict[str, np.ndarray], column: str) -> list[Any]:
    """The batch's messages column as lists of message dicts: Arrow's nulls dropped (a column of messages with
    different fields has each field in every message), a JSON text read as its list (validation refuses the rest
    in its row)."""
    return [_plain(_json(value)) for value in _column(batch, column)]


def _column(batch: dict[str, np.ndarray], column: str) -> np.ndarray:
    if column not in batch:
        raise KeyError(f"no column '{column}' in the dataset (columns: {sorted(batch)})")
    return batch[column]


def _json(value: Any) -> Any:
    """A text's JSON value where it is JSON; anything else as it is."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return json.loads(value)
    return value


def _plain(value: Any) -> Any:
    """Plain Python of a value Ray Data hands a batch: arrays as lists, dicts without their null fields."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items() if item is not None}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(item) for item in value]
    return value


def rows_out(batch: dict[str, np.ndarray], results: Sequence[dict[str, Any]], columns: dict[str, Any]) -> Any:
    """A table of the input columns plus ``columns`` (name -> Arrow type) taken from each row's result.

    The output columns carry their Arrow types explicitly: a batch in which no row failed has only nulls in
    ``error``, which Arrow would otherwise type as ``null`` in that batch and ``string`` in another, and Parquet
    files written from such batches could not be read back as one dataset."""
    table = {name: _arrow_column(values) for name, values in batch.items()}
    for column, arrow_type in columns.items():
        table[column] = pa.array([r.get(column) for r in results], type=arrow_type)
    return pa.table(table)


def _arrow_column(values: np.ndarray) -> Any:
    """An input column as Arrow: 1-D arrays as they are, N-D ones as Ray Data's tensor column."""
    if values.ndim <= 1:
        return pa.array(values)
    from ray.data.extensions import ArrowTensorArray

    return ArrowTensorArray.from_numpy(values)
