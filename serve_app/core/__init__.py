"""The cores: an engine, the batcher in front of it and request building, with the one path every request takes,
working without Ray Serve (a Serve replica, a Ray Data actor or any asyncio program holds one).
:class:`Generator` generates; :class:`Embedder` embeds.

Names are imported when first used (PEP 562), so that a light module here (``rows``) comes without the engines."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .embedder import Embedder
    from .generator import Generator
    from .requests import RequestBuilder, parse

_MODULES = {"Embedder": "embedder", "Generator": "generator", "RequestBuilder": "requests", "parse": "requests"}

__all__ = ["Embedder", "Generator", "RequestBuilder", "parse"]


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULES[name]}", __name__), name)
