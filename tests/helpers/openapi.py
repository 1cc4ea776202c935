"""Validate what the server sends against a schema of OpenAI's official OpenAPI spec."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import jsonschema
import referencing
import referencing.jsonschema
import yaml

# Vendored in the repository (tests/helpers/spec/README.md says from where), so a clone runs anywhere.
DEFAULT_SPEC_PATH = Path(__file__).resolve().parent / "spec" / "openai-openapi.yaml"
# The whole document is registered under this URI, so "#/components/schemas/X" refs inside
# any schema resolve against the document root.
SPEC_URI = "urn:openai-openapi"

_YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def spec_path() -> Path:
    return Path(os.environ.get("RILL_OPENAPI_SPEC") or DEFAULT_SPEC_PATH)


def _with_null(node: dict[str, Any]) -> dict[str, Any]:
    """Rewrite one OpenAPI 3.0 `nullable: true` node as JSON Schema that admits null."""
    node = dict(node)
    del node["nullable"]
    type_ = node.get("type")
    if type_ is not None and "const" not in node:
        types = [type_] if isinstance(type_, str) else list(type_)
        node["type"] = types if "null" in types else [*types, "null"]
        # An enum is checked on its own: null has to be one of its values too
        # (e.g. the stream chunk's finish_reason is `type: string, enum: [...], nullable`).
        if "enum" in node and None not in node["enum"]:
            node["enum"] = [*node["enum"], None]
        return node
    # No type to widen ($ref, allOf, const): null becomes a second branch.
    description = node.pop("description", None)
    wrapped: dict[str, Any] = {"anyOf": [node, {"type": "null"}]}
    if description is not None:
        wrapped["description"] = description
    return wrapped


def _convert_nullable(node: Any) -> Any:
    if isinstance(node, dict):
        node = {key: _convert_nullable(value) for key, value in node.items()}
        if node.get("nullable") is True:
            return _with_null(node)
        node.pop("nullable", None)  # `nullable: false` is the JSON Schema default anyway
        return node
    if isinstance(node, list):
        return [_convert_nullable(item) for item in node]
    return node


@functools.cache
def load_spec() -> dict[str, Any]:
    """The parsed spec with nullable rewritten; parsed once per process (3 MB of YAML)."""
    with open(spec_path(), "rb") as f:
        return _convert_nullable(yaml.load(f, Loader=_YamlLoader))


@functools.cache
def _registry() -> referencing.Registry:
    resource = referencing.Resource(
        contents=load_spec(), specification=referencing.jsonschema.DRAFT202012
    )
    return referencing.Registry().with_resource(SPEC_URI, resource)


@functools.cache
def validator(schema_name: str) -> jsonschema.Draft202012Validator:
    """A validator for `#/components/schemas/<schema_name>`, built once per name."""
    if schema_name not in load_spec()["components"]["schemas"]:
        raise KeyError(f"no schema {schema_name!r} in {spec_path()}")
    schema = {"$ref": f"{SPEC_URI}#/components/schemas/{schema_name}"}
    return jsonschema.Draft202012Validator(schema, registry=_registry())


def validate(schema_name: str, instance: Any) -> None:
    """Raise jsonschema.ValidationError if `instance` does not match the named schema."""
    errors = list(validator(schema_name).iter_errors(instance))
    if not errors:
        return
    # best_match picks the most relevant error out of anyOf branches; the message then
    # names the failing path, so a test failure reads without a debugger.
    best = jsonschema.exceptions.best_match(errors)
    where = "$" + "".join(f"[{p!r}]" for p in best.absolute_path)
    raise jsonschema.ValidationError(
        f"{schema_name} at {where}: {best.message}{_branch_detail(best)}"
        f" ({len(errors)} error(s) in all)",
        validator=best.validator,
        path=best.absolute_path,
        cause=best.cause,
        context=best.context,
        validator_value=best.validator_value,
        instance=best.instance,
        schema=best.schema,
        schema_path=best.absolute_schema_path,
    )


def _branch_detail(error: jsonschema.ValidationError) -> str:
    """Why an anyOf failed, minus the uninformative "is not of type 'null'" branch."""
    reasons = [
        f"{'$' + ''.join(f'[{p!r}]' for p in e.absolute_path)}: {e.message}"
        for e in error.context
        if not (e.validator == "type" and e.validator_value == "null")
    ]
    return f" (because {'; '.join(reasons[:3])})" if reasons else ""
