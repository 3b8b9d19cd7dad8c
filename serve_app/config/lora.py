"""LoRA adapters served beside the generation app's base model (its ``lora`` setting): vLLM's ``enable_lora``,
and the adapters a request may name in its ``model`` field, as ``vllm serve --lora-modules name=folder`` does."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from .common import PROJECT, Strict

BUNDLED = "bundled"
"""An adapter folder that stands for the bundled adapter (``serve_app.adapters``, trained by ``make model``)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")


def check_adapter_name(name: str) -> None:
    """Raise ``ValueError`` for a name a request could not send as ``model``."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"adapter name {name!r}: letters, digits and . _ : - only, starting with a letter or digit")


def adapter_folder(folder: str, prepare: bool = True) -> str:
    """The folder an adapter loads from: ``bundled`` is the bundled adapter's (trained here if it is not yet and
    ``prepare``)."""
    if folder != BUNDLED:
        return folder
    from .. import adapters

    return str(adapters.prepare() if prepare else adapters.adapter_path())


class LoraSettings(Strict):
    """LoRA adapters of the base model, picked per request by name (``model``)."""

    adapters: dict[str, str] = Field(
        ...,
        min_length=1,
        description="adapter name -> its folder (peft's `adapter_config.json` and weights; a relative path from "
        "the project's folder); `bundled`: the bundled adapter, trained offline by `make model`",
    )
    max_loaded: int = Field(
        2,
        ge=1,
        description="adapters an engine holds at once (vLLM's max_loras); others wait in CPU memory, and requests "
        "for them wait in the batcher's queue until one of those running has no request left there",
    )
    max_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = Field(
        16, description="the largest adapter rank (vLLM's max_lora_rank, one of its sizes)"
    )

    @field_validator("adapters")
    @classmethod
    def _names_and_folders(cls, adapters: dict[str, str]) -> dict[str, str]:
        out = {}
        for name, folder in adapters.items():
            check_adapter_name(name)
            if folder != BUNDLED:
                path = (PROJECT / Path(folder).expanduser()).resolve()
                if not (path / "adapter_config.json").is_file():
                    raise ValueError(f"adapter {name!r}: no adapter_config.json in {path}")
                folder = str(path)
            out[name] = folder
        return out

    def engine_args(self) -> dict[str, Any]:
        """vLLM's ``AsyncEngineArgs`` for these adapters."""
        return {  # every slot, whatever is named now: adapters loaded at run time need theirs
            "enable_lora": True,
            "max_loras": self.max_loaded,
            "max_lora_rank": self.max_rank,
            "max_cpu_loras": max(self.max_loaded, len(self.adapters)),
        }
