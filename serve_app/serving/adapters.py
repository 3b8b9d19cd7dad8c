"""LoRA adapters loaded and unloaded at run time, as vLLM's server does (``/v1/load_lora_adapter``,
``/v1/unload_lora_adapter``), for a whole app: the adapters live in one Ray actor per app, which every replica
reads with its gauges, once a second (and the replica that took the call at once), so that any replica answers a
request naming one, a replica started later included. Only an app with the ``lora`` setting takes them (vLLM's
``enable_lora``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
from pydantic import BaseModel, Field

from ..config import AppConfig
from ..config.lora import adapter_config, check_adapter_name
from ..errors import NotFoundError, RequestError

NAMESPACE = "token_batching"


class LoadAdapterRequest(BaseModel):
    """vLLM's ``POST /v1/load_lora_adapter`` body."""

    lora_name: str = Field(..., min_length=1, max_length=256)
    lora_path: str = Field(..., min_length=1, max_length=4096)


class UnloadAdapterRequest(BaseModel):
    """vLLM's ``POST /v1/unload_lora_adapter`` body (``lora_int_id`` accepted and unused, as in vLLM)."""

    lora_name: str = Field(..., min_length=1, max_length=256)
    lora_int_id: int | None = None


@ray.remote(num_cpus=0)
class AdapterRegistry:
    """One app's adapters loaded at run time: name -> folder."""

    def __init__(self) -> None:
        self.adapters: dict[str, str] = {}

    def load(self, name: str, folder: str) -> bool:
        if name in self.adapters:
            return False
        self.adapters[name] = folder
        return True

    def unload(self, name: str) -> bool:
        return self.adapters.pop(name, None) is not None

    def all(self) -> dict[str, str]:
        return dict(self.adapters)


def registry(app: str) -> Any:
    """The app's registry, started by the first replica that needs it (detached: it outlives any one replica)."""
    name = f"token_batching_adapters:{app}"
    return AdapterRegistry.options(name=name, namespace=NAMESPACE, get_if_exists=True, lifetime="detached").remote()


def checked_folder(config: AppConfig, body: LoadAdapterRequest) -> str:
    """The folder of an adapter to load, or a :class:`RequestError` saying why it cannot be (no ``lora`` setting,
    a name taken or bad, no adapter there, a rank above ``lora.max_rank``, a module the engine applies no LoRA to)."""
    if config.lora is None:
        raise RequestError("this app serves no LoRA adapters: set `lora` in its config to load them", "lora_name")
    name = body.lora_name
    try:
        check_adapter_name(name)
    except ValueError as exc:
        raise RequestError(str(exc), "lora_name") from None
    if name in config.lora.adapters or name in (config.model_name, config.model):
        raise RequestError(f"The lora adapter '{name}' has already been loaded.", "lora_name")
    folder = Path(body.lora_path).expanduser().resolve()
    try:
        adapter = adapter_config(folder)
    except (OSError, ValueError) as exc:
        raise RequestError(f"no LoRA adapter in {folder}: {exc}", "lora_path") from None
    rank = adapter.get("r")
    if isinstance(rank, int) and rank > config.lora.max_rank:
        raise RequestError(f"the adapter's rank {rank} is above lora.max_rank ({config.lora.max_rank})", "lora_path")
    try:
        config.lora.check_adapter(adapter)
    except ValueError as exc:
        raise RequestError(str(exc), "lora_path") from None
    return str(folder)


async def load(app: str, config: AppConfig, body: LoadAdapterRequest) -> str:
    """Load an adapter into the app's registry; what vLLM's server answers."""
    folder = checked_folder(config, body)
    if not await registry(app).load.remote(body.lora_name, folder):
        raise RequestError(f"The lora adapter '{body.lora_name}' has already been loaded.", "lora_name")
    return f"Success: LoRA adapter '{body.lora_name}' added successfully."


async def unload(app: str, config: AppConfig, body: UnloadAdapterRequest) -> str:
    """Unload an adapter loaded at run time; one of the ``lora`` setting's stays (400), an unknown one is a 404."""
    if config.lora is not None and body.lora_name in config.lora.adapters:
        raise RequestError(f"'{body.lora_name}' is in the app's lora setting: it cannot be unloaded", "lora_name")
    if not await registry(app).unload.remote(body.lora_name):
        raise NotFoundError(f"The lora adapter '{body.lora_name}' cannot be found.", "lora_name")
    return f"Success: LoRA adapter '{body.lora_name}' removed successfully."
