"""LoRA adapters served beside the generation app's base model (its ``lora`` setting): vLLM's ``enable_lora``,
and the adapters a request may name in its ``model`` field, as ``vllm serve --lora-modules name=folder`` does."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

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


def adapter_config(folder: str | Path) -> dict[str, Any]:
    """An adapter folder's ``adapter_config.json`` (peft's); ``OSError`` or ``ValueError`` where there is none."""
    config = json.loads((Path(folder) / "adapter_config.json").read_text())
    if not isinstance(config, dict):
        raise ValueError("adapter_config.json is not a JSON object")
    return config


def adapter_modules(config: dict[str, Any]) -> set[str] | None:
    """The model's modules an adapter changes (its ``target_modules``); None where that is not a list of names
    (peft's pattern or ``all-linear``) or it also saves whole modules (``modules_to_save``): any module, then."""
    targets = config.get("target_modules")
    if not isinstance(targets, list) or config.get("modules_to_save"):
        return None
    return {str(name) for name in targets}


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
        "for them wait in vLLM's scheduler until one of those running has no request left (see `queue_adapters`)",
    )
    queue_adapters: bool = Field(
        False,
        description="admission counts adapters: at most `max_loaded` run at once, and requests for another one "
        "wait in the batcher's queue, where priorities and fair share apply, until one of those running drains "
        "for them (a bounded wait; the adapter on deck waits in vLLM's scheduler meanwhile). Off: vLLM's "
        "scheduler holds them, as vLLM's server does, which made more tokens on the bundled model "
        "(docs/fleet.md)",
    )
    max_rank: Literal[1, 8, 16, 32, 64, 128, 256, 320, 512] = Field(
        16, description="the largest adapter rank (vLLM's max_lora_rank, one of its sizes)"
    )

    target_modules: Literal["auto", "all"] | Annotated[list[str], Field(min_length=1)] = Field(
        "auto",
        description="the model's modules an engine applies LoRA to (vLLM's lora_target_modules): `auto`, those "
        "the named adapters target (each one's adapter_config.json); `all`, every module vLLM can (its default); "
        "or module names (`q_proj`, `v_proj`, ...). Every other module's LoRA kernels would run on every step for "
        "nothing (docs/fleet.md); an adapter loaded at run time must target these modules alone",
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

    @model_validator(mode="after")
    def _named_adapters_covered(self) -> LoraSettings:
        """A module list that leaves out a module a named adapter targets would lose it without a word."""
        if isinstance(self.target_modules, list):
            for name, folder in self.adapters.items():
                path = Path(adapter_folder(folder, prepare=False))
                if (path / "adapter_config.json").is_file():  # the bundled one only once `make model` trained it
                    try:
                        self.check_adapter(adapter_config(path))
                    except ValueError as exc:
                        raise ValueError(f"adapter {name!r}: {exc}") from None
        return self

    def engine_modules(self) -> list[str] | None:
        """The modules the engine applies LoRA to; None for every one vLLM can (the named adapters' folders are
        read for `auto`, the bundled one trained first if it is not yet)."""
        if self.target_modules == "all":
            return None
        if self.target_modules != "auto":
            return list(self.target_modules)
        found: set[str] = set()
        for folder in self.adapters.values():
            modules = adapter_modules(adapter_config(adapter_folder(folder)))
            if modules is None:
                return None
            found |= modules
        return sorted(found)

    def check_adapter(self, config: dict[str, Any]) -> None:
        """Raise ``ValueError`` for an adapter (its ``adapter_config.json``) that targets a module the engine
        applies no LoRA to: vLLM would leave that module's weights out of its answers without a word."""
        engine = self.engine_modules()
        if engine is None:
            return
        modules = adapter_modules(config)
        missing = "a pattern or whole modules" if modules is None else ", ".join(sorted(modules - set(engine)))
        if missing:
            raise ValueError(
                f"the adapter targets {missing}; this app's engine applies LoRA to {', '.join(engine)} alone "
                "(lora.target_modules): name its modules there, or set it to `all`"
            )

    def engine_args(self) -> dict[str, Any]:
        """vLLM's ``AsyncEngineArgs`` for these adapters."""
        modules = self.engine_modules()
        return {  # every slot, whatever is named now: adapters loaded at run time need theirs
            "enable_lora": True,
            "max_loras": self.max_loaded,
            "max_lora_rank": self.max_rank,
            "max_cpu_loras": max(self.max_loaded, len(self.adapters)),
            **({"lora_target_modules": modules} if modules is not None else {}),
        }
