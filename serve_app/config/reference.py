"""The configuration reference, generated from the models' own field descriptions (their one source):

    python -m serve_app.config.reference > docs/configuration.md

``tests/test_config_reference.py`` fails when ``docs/configuration.md`` and the models drift apart."""

from __future__ import annotations

import inspect
import sys
import types
import typing
from collections.abc import Iterator
from typing import Any

import annotated_types
from pydantic import BaseModel, SecretStr

from .batcher import BatchSettings, ContinuousSettings
from .embeddings import EmbeddingConfig
from .generation import AppConfig

PREAMBLE = """# Configuration reference

Each application's `args` in `serve_config.yaml` is validated when the app is built, so a bad value fails
`serve run` at once with a message naming the field; unknown keys are errors too. This page is generated from the
models in `serve_app/config/` (`python -m serve_app.config.reference > docs/configuration.md`): their field
descriptions are the one place each setting is described.

The batcher's settings can also change live: set the deployment's `user_config` to `{"batcher": {...}}` and each
replica swaps in a new batcher while the old one drains.
"""

_BOUNDS = {
    annotated_types.Ge: ("≥", "ge"),
    annotated_types.Gt: (">", "gt"),
    annotated_types.Le: ("≤", "le"),
    annotated_types.Lt: ("<", "lt"),
}


def _bound(metadata: Any) -> str:
    """`` ≥ 1`` for pydantic's ``ge=1`` (and the like); empty for other metadata."""
    if type(metadata) not in _BOUNDS:
        return ""
    sign, attribute = _BOUNDS[type(metadata)]
    return f" {sign} {getattr(metadata, attribute)}"


def _doc(cls: type) -> str:
    return " ".join(inspect.cleandoc(cls.__doc__ or "").split())


def _type(annotation: Any) -> str:
    """A short reading of a field's type: ``auto`` or int ≥ 1, float, list of str, ..."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0]) + "".join(_bound(m) for m in args[1:])
    if origin is typing.Literal:
        return " or ".join(f"`{value}`" for value in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(arg) for arg in args)
    if origin is list:
        return f"list of {_type(args[0])}"
    if origin is dict:
        return "mapping"
    if annotation is type(None):
        return "null"
    if annotation is SecretStr:
        return "secret string"
    return getattr(annotation, "__name__", str(annotation))


def _value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _table(model: BaseModel, prefix: str = "") -> Iterator[str]:
    """One row per scalar field of ``model`` (an instance: its values are the defaults)."""
    yield "| key | type | default | meaning |"
    yield "| --- | --- | --- | --- |"
    for name, field in type(model).model_fields.items():
        if not hasattr(model, name):  # a required field of settings that are off by default
            default = "required"
        elif isinstance(value := getattr(model, name), BaseModel):
            continue
        else:
            default = _value(value)
        kind = _type(field.annotation) + "".join(_bound(m) for m in field.metadata)
        yield f"| `{prefix}{name}` | {kind} | {default} | {field.description or ''} |"


def _sections(model: BaseModel, title: str) -> Iterator[str]:
    yield f"## {title}"
    yield ""
    yield _doc(type(model))
    yield ""
    yield from _table(model)
    for name, field in type(model).model_fields.items():
        value = getattr(model, name) or _optional_model(field.annotation)
        if not isinstance(value, BaseModel):
            continue
        variants = [value] if name != "batcher" else _batchers(model)
        for variant in variants:
            mode = f" with `mode: {variant.mode}`" if name == "batcher" else ""
            yield ""
            yield f"### `{name}`{mode}"
            yield ""
            yield _doc(type(variant))
            yield ""
            yield from _table(variant, f"{name}.")


def _optional_model(annotation: Any) -> BaseModel | None:
    """For a ``Settings | None`` field that is off by default: the settings' defaults, once set (a required field
    left unset)."""
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg.model_construct()
    return None


def _batchers(model: BaseModel) -> list[BaseModel]:
    """Both batcher modes, with the app's defaults (the embedding app's are each engine's own)."""
    if isinstance(model, EmbeddingConfig):
        return [EmbeddingConfig(engine=engine).batcher for engine in ("vllm", "padded")]
    return [ContinuousSettings(), BatchSettings()]


def render() -> str:
    """The whole reference, as ``docs/configuration.md`` holds it."""
    lines = [PREAMBLE]
    lines += _sections(AppConfig(), "The generation app: `serve_app.app:build_app` (`AppConfig`)")
    lines += [""]
    lines += _sections(EmbeddingConfig(), "The embedding app: `serve_app.app:build_embeddings_app` (`EmbeddingConfig`)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
