"""The configuration reference in docs/ is generated from the config models' own descriptions, and kept so."""

from __future__ import annotations

from pathlib import Path

from serve_app.config import AppConfig, BatchSettings, ContinuousSettings, EmbeddingConfig
from serve_app.config.reference import render

ROOT = Path(__file__).resolve().parent.parent


def test_docs_configuration_md_is_what_the_models_generate():
    assert (ROOT / "docs" / "configuration.md").read_text() == render(), (
        "docs/configuration.md is stale: run `python -m serve_app.config.reference > docs/configuration.md`"
    )


def test_every_setting_has_a_description():
    def undescribed(model: type, prefix: str = "") -> list[str]:
        missing = []
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
                missing += undescribed(annotation, f"{prefix}{name}.")
            elif name != "batcher" and not field.description:
                missing.append(prefix + name)
        return missing

    for model in (AppConfig, EmbeddingConfig, ContinuousSettings, BatchSettings):
        assert undescribed(model) == [], model.__name__
