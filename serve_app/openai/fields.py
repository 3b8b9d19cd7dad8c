"""What an OpenAI request body does with the fields it does not take, as vLLM's server does: a field neither OpenAI
nor vLLM defines is ignored (its name logged once), so a client that sends fields newer than this server still
works; a vLLM extension this server does not implement is refused (a 400 naming it) unless it carries vLLM's
default, which changes nothing."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_validator

from .types import Refusal

logger = logging.getLogger(__name__)

_logged: set[tuple[str, str]] = set()
_known: dict[type, frozenset[str]] = {}

GENERATION_EXTENSIONS: Mapping[str, Any] = {
    "ec_transfer_params": None,
    "kv_transfer_params": None,
    "logprob_token_ids": None,
    "mm_payload": "tensors",
    "return_mm_kwargs": None,
    "return_token_offsets": False,
    "routed_experts_prompt_start": 0,
    "session_id": None,
    "thinking_token_budget": None,
    "vllm_xargs": None,
    "watermarking": None,
}
"""vLLM's extensions of both generation bodies that this server does not implement, with vLLM's defaults."""


class OpenAIModel(BaseModel):
    """A request body, or a part of one, that ignores fields it does not know and refuses the vLLM extensions named
    in :attr:`VLLM_EXTENSIONS` when they ask for something (:meth:`extension_refusals`)."""

    model_config = ConfigDict(extra="ignore")

    VLLM_EXTENSIONS: ClassVar[Mapping[str, Any]] = {}
    """vLLM's fields of this body that this server does not implement, each with vLLM's default."""

    _extensions_set: tuple[str, ...] = PrivateAttr(())

    @model_validator(mode="wrap")
    @classmethod
    def _fields_not_taken(cls, data: Any, handler: Any) -> Any:
        body = handler(data)
        if isinstance(data, dict) and isinstance(body, cls):
            known, extensions = cls.known_fields(), cls.VLLM_EXTENSIONS
            body._extensions_set = tuple(n for n in extensions if n in data and data[n] != extensions[n])
            for name in data.keys() - known:
                if (cls.__name__, name) not in _logged:
                    _logged.add((cls.__name__, name))
                    logger.warning("%s: ignoring the unknown field %r (logged once per field)", cls.__name__, name)
        return body

    @classmethod
    def known_fields(cls) -> frozenset[str]:
        """The body's fields by name and alias, and the vLLM extensions it refuses (what is not logged as unknown)."""
        if (known := _known.get(cls)) is None:
            aliases = {field.alias for field in cls.model_fields.values() if field.alias}
            known = _known[cls] = frozenset(cls.model_fields) | aliases | frozenset(cls.VLLM_EXTENSIONS)
        return known

    def extension_refusals(self) -> list[Refusal]:
        """The vLLM extensions this body sets that this server does not implement."""
        return [(name, "this vLLM extension is not supported by this server") for name in self._extensions_set]
