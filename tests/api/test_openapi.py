"""The generated API description documents what the API answers."""

from __future__ import annotations

from typing import Any

from openapi_spec_validator import validate

from tests.support.api_client import Api

METHODS = ("get", "put", "post", "delete", "patch")


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, item[method])
        for path, item in doc["paths"].items()
        for method in METHODS
        if method in item
    ]


def test_every_route_is_described(api: Api) -> None:
    doc = api.client.get("/openapi.json").json()
    described = {(m, p) for m, p, _ in operations(doc)}
    assert described == {
        ("POST", "/api/v1/runners"),
        ("GET", "/api/v1/runners/{runnerId}"),
        ("DELETE", "/api/v1/runners/{runnerId}"),
        ("POST", "/api/v1/runners/{runnerId}/execute"),
        ("GET", "/api/v1/runners/{runnerId}/websocket"),
        ("PATCH", "/api/v1/runners/{runnerId}/files"),
        ("GET", "/api/v1/runners/{runnerId}/files"),
        ("GET", "/api/v1/runners/{runnerId}/files/raw"),
        ("GET", "/api/v1/execution-environments"),
        ("GET", "/api/v1/execution-environments/{executionEnvironmentId}"),
        ("PUT", "/api/v1/execution-environments/{executionEnvironmentId}"),
        ("DELETE", "/api/v1/execution-environments/{executionEnvironmentId}"),
        ("GET", "/api/v1/execution-environments/{executionEnvironmentId}/prewarming"),
        ("GET", "/api/v1/statistics/execution-environments"),
        ("GET", "/api/v1/health"),
        ("GET", "/api/v1/version"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
    }


def test_validation_errors_are_documented_as_400_never_422(api: Api) -> None:
    doc = api.app.openapi()
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    assert "ValidationError" not in doc["components"]["schemas"]
    for method, path, operation in operations(doc):
        answers = operation["responses"]
        assert "422" not in answers, (method, path)
        if operation.get("parameters") or operation.get("requestBody"):
            assert answers["400"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/Error"
            }, (method, path)
        assert "413" in answers and "500" in answers


def test_bodies_and_answers_are_described(api: Api) -> None:
    doc = api.app.openapi()
    paths = doc["paths"]
    schemas = doc["components"]["schemas"]
    put = paths["/api/v1/execution-environments/{executionEnvironmentId}"]["put"]
    assert put["requestBody"]["required"] is True
    assert {"201", "204", "400", "413", "500", "503"} <= set(put["responses"])
    assert "claimed runners" in put["description"]
    env = schemas["EnvironmentRequest"]
    assert env["additionalProperties"] is False
    # what Poseidon takes without them: the path has the id, no ports is none
    assert set(env["required"]) == set(env["properties"]) - {"id", "exposedPorts"}
    assert env["properties"]["exposedPorts"]["uniqueItems"] is True
    assert env["properties"]["exposedPorts"]["items"]["minimum"] == 1
    assert env["properties"]["exposedPorts"]["items"]["maximum"] == 65535
    assert env["properties"]["prewarmingPoolSize"]["maximum"] == 10_000
    assert env["properties"]["cpuLimit"]["exclusiveMinimum"] == 0
    runner = schemas["RunnerRequest"]
    assert runner["required"] == ["executionEnvironmentId"]
    assert runner["additionalProperties"] is False
    post = paths["/api/v1/runners"]["post"]
    assert {"200", "400", "404", "500", "503"} <= set(post["responses"])
    error = schemas["Error"]
    assert error["required"] == ["message"] and error["additionalProperties"] is False
    assert set(schemas["ErrorCode"]["enum"]) == {
        "NOMAD_UNREACHABLE",
        "NOMAD_OVERLOAD",
        "NOMAD_INTERNAL_SERVER_ERROR",
        "PREWARMING_POOL_DEPLETING",
        "UNKNOWN",
        "NOT_LEADER",
        "SHUTTING_DOWN",
    }
    health = paths["/api/v1/health"]["get"]["responses"]
    assert "content" not in health["204"] and "503" in health
    assert "content" not in paths["/api/v1/runners/{runnerId}"]["delete"]["responses"]["204"]
    metrics = paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]


def test_the_description_is_a_valid_openapi_document_whose_refs_all_resolve(api: Api) -> None:
    """A client generator follows every `$ref`; one into a schema that is not
    defined (the PATCH …/files body, FileUpdate, was) stops it."""
    doc = api.client.get("/openapi.json").json()
    validate(doc)  # raises on any schema error, an unresolvable $ref included
    refs: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                refs.add(ref)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    defined = {f"#/components/schemas/{name}" for name in doc["components"]["schemas"]}
    assert refs and refs <= defined, sorted(refs - defined)
    body = doc["paths"]["/api/v1/runners/{runnerId}/files"]["patch"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/FileUpdate"
    }
