"""Token counters for ``token_estimator=``: a 4-characters-a-token heuristic and a real tokenizer.

``HFTokenCounter`` needs ``transformers`` (an optional dependency, imported only when it is built); the
``batching`` package itself stays standard-library only.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

__all__ = ["HFTokenCounter", "heuristic_tokens", "text_of"]

logger = logging.getLogger(__name__)


def text_of(record: Any) -> str:
    """The text of a record: a ``str`` itself, else its ``text`` or ``prompt`` attribute or key."""
    if isinstance(record, str):
        return record
    for name in ("text", "prompt"):
        value = record.get(name) if isinstance(record, dict) else getattr(record, name, None)
        if isinstance(value, str):
            return value
    raise TypeError(f"cannot find the text of a {type(record).__name__}: give it a 'text' or 'prompt' field")


def heuristic_tokens(record: Any, chars_per_token: int = 4) -> int:
    """The reference's estimate, ``len(text) // chars_per_token + 1``: free, and rough."""
    return len(text_of(record)) // chars_per_token + 1


class HFTokenCounter:
    """Count tokens with a Hugging Face tokenizer, caching the counts of recently seen texts.

    Usage: ``TokenBatcher(fn, token_estimator=HFTokenCounter("path/to/model"))``. ``tokenizer`` is a
    tokenizer object or a name/path for ``AutoTokenizer.from_pretrained`` (local files work offline).
    ``extra_tokens`` is added to every count, for example the generation budget of each request.
    """

    def __init__(self, tokenizer: Any, *, cache_size: int = 65_536, extra_tokens: int = 0) -> None:
        if isinstance(tokenizer, str):
            try:
                from transformers import AutoTokenizer
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise ImportError("HFTokenCounter needs the 'transformers' package: pip install transformers") from exc
            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        if cache_size < 0 or extra_tokens < 0:
            raise ValueError("cache_size and extra_tokens must be >= 0")
        self.tokenizer = tokenizer
        self._cache: OrderedDict[str, int] = OrderedDict()
        self._cache_size = cache_size
        self._extra = extra_tokens

    def count(self, text: str) -> int:
        """Tokens in ``text`` (no special tokens added), from the cache when seen recently."""
        cached = self._cache.get(text)
        if cached is not None:
            self._cache.move_to_end(text)
            return cached
        count = len(self.tokenizer.encode(text, add_special_tokens=False))
        if self._cache_size:
            self._cache[text] = count
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return count

    def __call__(self, record: Any) -> int:
        return self.count(text_of(record)) + self._extra
