"""The types the request models share: text that encodes to UTF-8, token ids, vLLM's priority, a refusal."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field


def is_valid_unicode(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8: JSON's ``\\ud800`` escapes decode to lone surrogates, which no
    tokenizer and no JSON response can carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _valid_unicode(value: str) -> str:
    if not is_valid_unicode(value):
        raise ValueError("not valid Unicode: holds a lone surrogate (such as '\\ud800')")
    return value


Text = Annotated[str, AfterValidator(_valid_unicode)]
"""A string that encodes to UTF-8 (JSON lets a client send lone surrogates; nothing downstream takes them)."""

TokenId = Annotated[int, Field(ge=0, lt=2**31)]

Priority = Annotated[int, Field(ge=-(2**31), lt=2**31)]
"""vLLM's request priority: lower runs first (interactive requests 0, batch jobs larger)."""

Refusal = tuple[str, str]
"""``(field, why)``: a field set to something this server cannot honour (a 400 naming it)."""
