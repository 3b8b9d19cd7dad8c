"""Structured output in request bodies: vLLM's ``structured_outputs`` and OpenAI's ``response_format``, each as the
engine's :class:`~serve_app.engines.StructuredOutputs` (what the output must match)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..engines import StructuredOutputs
from .fields import OpenAIModel
from .types import Text


class StructuredOutputsFields(BaseModel):
    """vLLM's ``structured_outputs``: exactly one constraint the output must match, and the JSON grammar's options."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_schema: dict[str, Any] | Text | None = Field(None, alias="json", description="a JSON schema")
    json_object: Literal[True] | None = Field(None, description="any JSON object")
    regex: Text | None = None
    choice: list[Text] | None = Field(None, min_length=1, max_length=1024, description="one of these strings")
    grammar: Text | None = Field(None, description="an EBNF (GBNF) or Lark grammar")
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: Text | None = None

    @model_validator(mode="after")
    def _one_constraint(self) -> StructuredOutputsFields:
        given = [name for name in CONSTRAINTS if getattr(self, CONSTRAINTS[name]) is not None]
        if len(given) != 1:
            raise ValueError(f"exactly one of {', '.join(CONSTRAINTS)} is needed, got {len(given)}")
        return self

    def constraint(self) -> StructuredOutputs:
        """The engine's constraint (a schema given as an object, as JSON text: hashable, its key order kept)."""
        schema = self.json_schema
        return StructuredOutputs(
            json=json.dumps(schema) if isinstance(schema, dict) else schema,
            json_object=self.json_object,
            regex=self.regex,
            choice=tuple(self.choice) if self.choice is not None else None,
            grammar=self.grammar,
            disable_any_whitespace=self.disable_any_whitespace,
            disable_additional_properties=self.disable_additional_properties,
            whitespace_pattern=self.whitespace_pattern,
        )


CONSTRAINTS = {
    "json": "json_schema",
    "json_object": "json_object",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
}
"""A constraint's name in the body, and its attribute."""


class JsonSchemaFormat(OpenAIModel):
    """OpenAI's ``response_format.json_schema``: a named schema (``strict`` is how vLLM always decodes it)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: Text = Field(..., max_length=64)
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIModel):
    """OpenAI's ``response_format``: free ``text``, any JSON object, or JSON matching ``json_schema`` (a structural
    tag's own fields are ignored with the rest: the tag is refused)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs the 'json_schema' field")
        return self

    def constraint(self) -> StructuredOutputs | None:
        """The engine's constraint (a ``json_schema`` without a ``schema``: any JSON object); None for text."""
        if self.type == "json_object" or (self.type == "json_schema" and self.json_schema.schema_ is None):
            return StructuredOutputs(json_object=True)
        if self.type == "json_schema":
            return StructuredOutputs(json=json.dumps(self.json_schema.schema_))
        return None
