"""The cores: an engine, the batcher in front of it and request building, with the one path every request takes,
working without Ray Serve (a Serve replica, a Ray Data actor or any asyncio program holds one).
:class:`Generator` generates; :class:`Embedder` embeds."""

from .embedder import Embedder
from .generator import Generator, error_row
from .requests import RequestBuilder, parse

__all__ = ["Embedder", "Generator", "RequestBuilder", "error_row", "parse"]
