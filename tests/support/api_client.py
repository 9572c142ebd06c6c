"""The API tests' client side: test clients whose every response is checked
against the app's own `/openapi.json` (its status documented for the
operation, its body matching the documented schema), `Api` — one simulator,
controller and app as a test reaches them — and the bodies and error shapes
of the API."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient
from openapi_schema_validator import OAS31Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from controller.model import Phase
from controller.reconcile.loop import Controller
from nomadsim import SimServer
from tests.helpers import wait_until

API = "/api/v1"
TOKEN = "s3cret-token-16ch"
ROOT_URI = "urn:nrc-openapi"
# How the API tests' controllers reach Nomad (`tests.support.controller.start_controller`
# keywords): a short timeout, few and fast retries.
GATEWAY: dict[str, Any] = {"timeout_s": 2.0, "retries": 2, "retry_max_wait_s": 0.05}


def environment_body(env_id: int, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": env_id,
        "image": "python:3.12",
        "prewarmingPoolSize": 2,
        "cpuLimit": 100,
        "memoryLimit": 128,
        "networkAccess": False,
        "exposedPorts": [],
    }
    body.update(overrides)
    return body


# -- checking responses against our own OpenAPI document ---------------------------


class ContractChecker:
    """Holds responses against the app's OpenAPI document."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.registry: Registry[Any] = Registry().with_resource(
            ROOT_URI, Resource.from_contents(document, default_specification=DRAFT202012)
        )
        self.templates = [(path, path.split("/")) for path in document["paths"] if "{" in path]

    def operation(self, method: str, path: str) -> dict[str, Any] | None:
        item = self.document["paths"].get(path)
        if item is None:
            parts = path.split("/")
            for template, tparts in self.templates:
                if len(tparts) == len(parts) and all(
                    t == p or (t.startswith("{") and p) for t, p in zip(tparts, parts, strict=True)
                ):
                    item = self.document["paths"][template]
                    break
        return None if item is None else item.get(method.lower())

    def check(self, response: httpx.Response) -> None:
        request = response.request
        if request.url.path == "/openapi.json":
            return  # the description itself is not described
        operation = self.operation(request.method, request.url.path)
        if operation is None:
            # not an operation: an unknown route or method, in the error shape
            assert response.status_code in (404, 405), (request.url, response.status_code)
            self._validate({"$ref": f"{ROOT_URI}#/components/schemas/Error"}, response.json())
            return
        documented = operation["responses"].get(str(response.status_code))
        assert documented is not None, (
            f"{request.method} {request.url.path} answered {response.status_code}, "
            f"documented: {sorted(operation['responses'])}"
        )
        content = documented.get("content")
        if not content:
            assert response.content == b"", (request.url, response.content)
            return
        media = response.headers.get("content-type", "").split(";")[0].strip()
        assert media in content, (request.url, media, list(content))
        schema = content[media].get("schema")
        if schema is not None and media == "application/json":
            self._validate(self._rooted(schema), response.json())

    def _rooted(self, schema: Any) -> Any:
        if isinstance(schema, dict):
            return {
                k: (f"{ROOT_URI}{v}" if k == "$ref" else self._rooted(v)) for k, v in schema.items()
            }
        if isinstance(schema, list):
            return [self._rooted(v) for v in schema]
        return schema

    def _validate(self, schema: Any, body: Any) -> None:
        validator = OAS31Validator(schema, registry=self.registry)
        errors = [e.message for e in validator.iter_errors(body)]
        assert not errors, (body, errors)


def client_for(app: FastAPI, **headers: str) -> TestClient:
    """A test client whose every response is checked against the app's OpenAPI."""
    # Bodies are JSON, with its Content-Type, as platforms send them.
    client = TestClient(app, headers={"Content-Type": "application/json", **headers})
    checker = ContractChecker(app.openapi())

    def check(response: httpx.Response) -> None:
        response.read()
        checker.check(response)

    client.event_hooks = {"request": [], "response": [check]}
    return client


# -- one simulator, controller and app ----------------------------------------------


@dataclass
class Api:
    sim: SimServer
    controller: Controller
    app: FastAPI
    client: TestClient

    def put_environment(self, env_id: int, **overrides: Any) -> dict[str, Any]:
        body = environment_body(env_id, **overrides)
        r = self.client.put(f"{API}/execution-environments/{env_id}", json=body)
        assert r.status_code in (201, 204), r.text
        return body

    def wait_pool(self, env_id: int, ready: int, timeout: float = 10.0) -> None:
        def full() -> bool:
            views = self.controller.observer.snapshot.views(env_id)
            idle = [v for v in views if not v.claimed and v.phase is Phase.READY]
            env = self.controller.pools.environment(env_id)
            current = env.template_hash if env else None
            return len(idle) >= ready and all(v.job.template_hash == current for v in idle)

        wait_until(full, timeout=timeout)

    def claim(self, env_id: int, timeout_s: int = 0) -> dict[str, Any]:
        r = self.client.post(
            f"{API}/runners",
            json={"executionEnvironmentId": env_id, "inactivityTimeout": timeout_s},
        )
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body


MakeApi = Callable[..., Api]


def error_of(response: httpx.Response) -> tuple[int, str, str | None]:
    """(status, message, errorCode) of an error answer, checking its shape."""
    body = response.json()
    assert isinstance(body, dict) and set(body) <= {"message", "errorCode"}, body
    assert isinstance(body["message"], str) and body["message"], body
    return response.status_code, body["message"], body.get("errorCode")


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()
