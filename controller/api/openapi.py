"""The API description at `/openapi.json`, adjusted to what the API answers.

FastAPI's generated document is changed where our handling differs from
FastAPI's defaults, so that a schema-driven tester (schemathesis) can hold
every response against it:

- validation errors are 400 with our Error body, never 422: the 422 entries
  and FastAPI's validation error schemas are removed, and 400 is documented
  wherever a parameter or a body is read;
- request bodies are read by `controller.api.body`, so their schemas are
  added here (with `prewarmingPoolSize`'s configured maximum);
- every operation may answer 403 (a web page's request, `guard`), 413 (body
  over 1 MiB, checked before routing) and 500 UNKNOWN (the catch-all);
- with a token configured, every protected operation documents 401; both
  security schemes are always declared.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from controller.api.auth import SECURITY_SCHEMES
from controller.api.errors import DESCRIPTIONS
from controller.api.models import (
    EnvironmentRequest,
    ExecutionRequest,
    FileUpdate,
    RunnerRequest,
)

REF_TEMPLATE = "#/components/schemas/{model}"
# Every body `controller.api.body.request_body` documents (by reference).
BODIES = (RunnerRequest, EnvironmentRequest, ExecutionRequest, FileUpdate)
ERROR_REF = {"$ref": "#/components/schemas/Error"}
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def _error(status: int) -> dict[str, Any]:
    return {
        "description": DESCRIPTIONS[status],
        "content": {"application/json": {"schema": ERROR_REF}},
    }


def _add_model(schemas: dict[str, Any], model: type[BaseModel]) -> None:
    schema = model.model_json_schema(ref_template=REF_TEMPLATE)
    schemas.update(schema.pop("$defs", {}))
    schemas[model.__name__] = schema


def build(app: FastAPI, *, description: str, max_pool_size: int) -> dict[str, Any]:
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=description,
        routes=app.routes,
        tags=app.openapi_tags,
        separate_input_output_schemas=False,
    )
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for model in BODIES:
        _add_model(schemas, model)
    schemas["EnvironmentRequest"]["properties"]["prewarmingPoolSize"]["maximum"] = max_pool_size
    components["securitySchemes"] = {**SECURITY_SCHEMES, **components.get("securitySchemes", {})}
    for item in schema.get("paths", {}).values():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            answers = operation.setdefault("responses", {})
            answers.pop("422", None)
            if operation.get("parameters") or operation.get("requestBody"):
                answers.setdefault("400", _error(400))
            if operation.get("security"):
                answers.setdefault("401", _error(401))
            answers.setdefault("403", _error(403))
            answers.setdefault("413", _error(413))
            answers.setdefault("500", _error(500))
    return schema
