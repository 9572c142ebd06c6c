"""Our answers against Poseidon's own API description (0.2.2).

`tests/reference/poseidon-api.yaml` (a copy of Poseidon's, see its README)
is the contract for the routes we share with Poseidon. Responses of a
scenario over every shared route are validated with openapi-schema-validator's
OAS30Validator against the response schemas of that file.

The single adjustment (in a copy, see `poseidon_document`): Poseidon's
InternalServerError body is `allOf: [ClientError, {errorCode}]`, and
ClientError says `additionalProperties: false`, so under JSON Schema no body
with an `errorCode` can match it, not even Poseidon's own. The copy merges the
two into one object with `message` and `errorCode` and still no other
property. Everything else, the errorCode enum included, is Poseidon's.

Where we answer a status Poseidon does not document for an operation, it is
listed in `DEVIATIONS` with the reason; the test fails on any other.
"""

from __future__ import annotations

import copy
import functools
import uuid
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from openapi_schema_validator import OAS30Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4
from starlette.testclient import WebSocketDenialResponse

from controller.api import create_app
from tests.reference import document
from tests.support.api_client import API, TOKEN, Api, environment_body

POSEIDON = document("poseidon-api.yaml")
ROOT_URI = "urn:poseidon-api"
METHODS = ("get", "put", "post", "delete", "patch")

RUNNER = "/runners/{runnerId}"
ENV = "/execution-environments/{executionEnvironmentId}"
# (method, Poseidon path) -> statuses we may answer that Poseidon does not document.
DEVIATIONS: dict[tuple[str, str], set[str]] = {
    # 503 NOT_LEADER: a replica that does not lead (leader election) does not serve.
    ("POST", "/runners"): {"503"},
    ("DELETE", RUNNER): {"503"},
    ("PUT", ENV): {"503", "500"},  # 500: Nomad unreachable or failing
    ("DELETE", ENV): {"503", "500"},
    # ?fetch=true re-lists Nomad: 500 when it cannot; 400 for an invalid ?fetch
    ("GET", "/execution-environments"): {"400", "500"},
    ("GET", ENV): {"500"},
    # Poseidon requires the token here too (`security`) but lists no 401
    ("GET", "/statistics/execution-environments"): {"401"},
    # /execute answers 503 NOT_LEADER too; the WebSocket's handshake route also
    # answers a plain GET (no upgrade) with 426, and 503 from a follower
    # and 429 when too many of its ids wait for their connect (issue 24)
    ("POST", RUNNER + "/execute"): {"503", "429"},
    ("GET", RUNNER + "/websocket"): {"426", "503"},
    # files: 503 from a follower; 409 a directory where a file goes (Poseidon:
    # a 500 after a partial copy); 416 a Range beyond the end (Poseidon has no
    # ranges, nor 206); 400 for a bad path or query (Poseidon lists 400 only
    # for PATCH)
    ("PATCH", RUNNER + "/files"): {"409", "503"},
    ("GET", RUNNER + "/files"): {"400", "409", "503"},
    ("GET", RUNNER + "/files/raw"): {"206", "400", "409", "416", "503"},
}
# 409 on list and download: a privileged one refuses a symbolic link on the
# path (Poseidon follows it, as root).
# Any operation: 403 for a web page's request (Poseidon has no browser
# defence), 413 for a body over 1 MiB, and the catch-all's 500 UNKNOWN (a
# code Poseidon documents) where Poseidon lists no 500.
ANYWHERE = {"403", "413", "500"}


@functools.cache
def poseidon_document() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(POSEIDON.read_text())
    doc = copy.deepcopy(doc)
    schemas = doc["components"]["schemas"]
    internal = doc["components"]["responses"]["InternalServerError"]["content"]["application/json"]
    client_error_ref, error_code = internal["schema"]["allOf"]
    assert client_error_ref == {"$ref": "#/components/schemas/ClientError"}
    client_error = schemas["ClientError"]
    internal["schema"] = {
        "type": "object",
        "properties": {**client_error["properties"], **error_code["properties"]},
        "required": client_error["required"],
        "additionalProperties": False,
    }
    return doc


def poseidon_path(path: str) -> str:
    assert path.startswith(API)
    return path[len(API) :] or "/"


def match_template(doc: dict[str, Any], path: str) -> str | None:
    parts = path.split("/")
    for template in doc["paths"]:
        tparts = template.split("/")
        if len(tparts) == len(parts) and all(
            t == p or (t.startswith("{") and p) for t, p in zip(tparts, parts, strict=True)
        ):
            return str(template)
    return None


class PoseidonChecker:
    def __init__(self) -> None:
        self.doc = poseidon_document()
        self.registry: Registry[Any] = Registry().with_resource(
            ROOT_URI, Resource.from_contents(self.doc, default_specification=DRAFT4)
        )
        self.seen: set[tuple[str, str, int]] = set()

    def resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        if ref is None:
            return node
        target: Any = self.doc
        for part in ref.lstrip("#/").split("/"):
            target = target[part.replace("~1", "/")]
        return self.resolve(target)

    def check(self, response: httpx.Response) -> None:
        self.check_answer(response.request.method, response.request.url.path, response)

    def check_answer(self, method: str, path: str, response: httpx.Response) -> None:
        """`response` answered `method path` (a WebSocket refusal has no request)."""
        template = match_template(self.doc, poseidon_path(path))
        assert template is not None, path
        operation = self.doc["paths"][template][method.lower()]
        status = str(response.status_code)
        self.seen.add((method, template, response.status_code))
        documented = operation["responses"].get(status)
        if documented is None:
            allowed = DEVIATIONS.get((method, template), set()) | ANYWHERE
            assert status in allowed, f"{method} {template} {status} is not documented"
            return
        if response.status_code in (201, 204):
            assert response.content == b"", (method, template, response.content)
        if self.resolve(documented).get("content") is None:
            return  # described without a body schema (404, 401, /version's 200)
        ref = self._schema_ref(template, method.lower(), status, documented)
        validator = OAS30Validator({"$ref": ref}, registry=self.registry)
        errors = [e.message for e in validator.iter_errors(response.json())]
        assert not errors, (method, template, status, response.json(), errors)

    @staticmethod
    def _pointer(template: str) -> str:
        return template.replace("~", "~0").replace("/", "~1")

    def _schema_ref(self, template: str, method: str, status: str, documented: Any) -> str:
        if "$ref" in documented:
            name = documented["$ref"].rsplit("/", 1)[1]
            return f"{ROOT_URI}#/components/responses/{name}/content/application~1json/schema"
        return (
            f"{ROOT_URI}#/paths/{self._pointer(template)}/{method}/responses/{status}"
            "/content/application~1json/schema"
        )


@pytest.fixture
def poseidon_clients(api: Api) -> tuple[TestClient, TestClient, PoseidonChecker]:
    checker = PoseidonChecker()

    def hook(response: httpx.Response) -> None:
        response.read()
        checker.check(response)

    plain = TestClient(api.app)
    plain.event_hooks = {"request": [], "response": [hook]}
    secured = TestClient(create_app(api.controller.pools, api_token=TOKEN))
    secured.event_hooks = {"request": [], "response": [hook]}
    return plain, secured, checker


def test_shared_routes_answer_as_poseidon_documents(
    api: Api, env_id: int, poseidon_clients: tuple[TestClient, TestClient, PoseidonChecker]
) -> None:
    client, secured, checker = poseidon_clients
    envs = f"{API}/execution-environments"
    body = environment_body(env_id, prewarmingPoolSize=1, networkAccess=True, exposedPorts=[80])
    assert client.put(f"{envs}/{env_id}", json=body).status_code == 201
    assert client.put(f"{envs}/{env_id}", json=body).status_code == 204
    assert client.put(f"{envs}/{env_id}", json={**body, "id": -1}).status_code == 400
    assert client.get(envs).status_code == 200
    assert client.get(envs, params={"fetch": "true"}).status_code == 200
    assert client.get(f"{envs}/{env_id}").status_code == 200
    assert client.get(f"{envs}/{env_id}", params={"fetch": "true"}).status_code == 200
    assert client.get(f"{envs}/987654").status_code == 404
    assert client.get(f"{envs}/abc").status_code == 400
    api.wait_pool(env_id, 1)
    runners = f"{API}/runners"
    r = client.post(runners, json={"executionEnvironmentId": env_id, "inactivityTimeout": 60})
    assert r.status_code == 200 and r.json()["mappedPorts"]
    runner = r.json()["runnerId"]
    assert client.post(runners, json={"executionEnvironmentId": "x"}).status_code == 400
    assert client.post(runners, json={"executionEnvironmentId": 987654}).status_code == 404
    empty = env_id + 10_000_000
    assert client.put(f"{envs}/{empty}", json=environment_body(empty, prewarmingPoolSize=0))
    r = client.post(runners, json={"executionEnvironmentId": empty})
    assert (r.status_code, r.json()["errorCode"]) == (500, "NOMAD_OVERLOAD")
    assert client.get(f"{API}/statistics/execution-environments").status_code == 200
    # executions: the route and the WebSocket's refusals before the upgrade
    execute = f"{runners}/{runner}/execute"
    r = client.post(execute, json={"command": "python exercise.py", "timeLimit": 5})
    assert r.status_code == 200 and "executionID=" in r.json()["websocketUrl"]
    assert client.post(execute, json={"command": 1}).status_code == 400
    assert (
        client.post(f"{runners}/{uuid.uuid4()}/execute", json={"command": "x"}).status_code == 410
    )
    assert secured.post(execute, json={"command": "x"}).status_code == 401
    websocket = f"{runners}/{runner}/websocket"
    for socket_client, path, status in (
        (secured, f"{websocket}?executionID=x", 401),
        (client, f"{websocket}?executionID=unknown", 404),
        (client, f"{runners}/{uuid.uuid4()}/websocket?executionID=x", 410),
    ):
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            socket_client.websocket_connect(path),
        ):
            pass
        assert refused.value.status_code == status
        checker.check_answer("GET", path.split("?")[0], refused.value)
    # files: this app has no Nomad exec, so an operation on a claimed runner is
    # Nomad's 500; the refusals before it are the ones to check here (the
    # answers of a real exec are checked end to end in tests/e2e/test_files.py)
    files = f"{runners}/{runner}/files"
    copy_body = {"copy": [{"path": "a.py", "content": "cHJpbnQoMSk="}], "delete": ["./*"]}
    r = client.patch(files, json=copy_body)
    assert (r.status_code, r.json()["errorCode"]) == (500, "NOMAD_INTERNAL_SERVER_ERROR")
    assert client.patch(files, json={"copy": [{"path": "a", "content": "!"}]}).status_code == 400
    assert client.patch(f"{runners}/{uuid.uuid4()}/files", json=copy_body).status_code == 410
    assert secured.patch(files, json=copy_body).status_code == 401
    assert client.get(files, params={"path": "./"}).status_code == 500
    assert client.get(f"{runners}/{uuid.uuid4()}/files").status_code == 410
    assert secured.get(files).status_code == 401
    assert client.get(f"{files}/raw", params={"path": "a.py"}).status_code == 500
    assert (
        client.get(f"{runners}/{uuid.uuid4()}/files/raw", params={"path": "a"}).status_code == 410
    )
    assert secured.get(f"{files}/raw", params={"path": "a.py"}).status_code == 401
    assert client.delete(f"{runners}/{runner}").status_code == 204
    assert client.delete(f"{runners}/{runner}").status_code == 410
    assert client.delete(f"{runners}/{uuid.uuid4()}").status_code == 410
    assert client.get(f"{API}/health").status_code in (204, 503)
    assert client.get(f"{API}/version").status_code == 200
    assert client.delete(f"{envs}/{env_id}").status_code == 204
    assert client.delete(f"{envs}/{empty}").status_code == 204
    assert client.delete(f"{envs}/{env_id}").status_code == 404
    assert client.delete(f"{envs}/x").status_code == 400
    assert client.post(runners, content=b" " * (2 << 20)).status_code == 413
    # with a token: 401 on every protected route, the open ones stay open
    assert secured.post(runners, json={"executionEnvironmentId": 1}).status_code == 401
    assert secured.delete(f"{runners}/{runner}").status_code == 401
    assert secured.get(envs).status_code == 401
    assert secured.get(f"{envs}/1").status_code == 401
    assert secured.put(f"{envs}/1", json=environment_body(1)).status_code == 401
    assert secured.delete(f"{envs}/1").status_code == 401
    assert secured.get(f"{API}/statistics/execution-environments").status_code == 401
    assert secured.get(f"{API}/version").status_code == 200
    # every shared operation was exercised
    exercised = {(m, t) for m, t, _ in checker.seen}
    shared = {
        (m.upper(), t) for t, item in checker.doc["paths"].items() for m in METHODS if m in item
    }
    assert exercised == shared


def test_our_description_stays_within_poseidon_plus_listed_deviations(api: Api) -> None:
    ours = api.app.openapi()
    theirs = poseidon_document()
    for path, item in theirs["paths"].items():
        for method in METHODS:
            if method not in item:
                continue
            our_op = ours["paths"][API + path][method]
            their_statuses = set(item[method]["responses"])
            extra = set(our_op["responses"]) - their_statuses - ANYWHERE
            extra -= DEVIATIONS.get((method.upper(), path), set())
            extra.discard("400")  # documented wherever we read a parameter
            extra.discard("401")  # documented only with a token configured
            assert not extra, (method, path, extra)
            missing = their_statuses - set(our_op["responses"]) - {"401"}
            # Poseidon's 404 on /version and 500 on others we never answer are fine to omit
            assert missing <= {"404"}, (method, path, missing)


def test_request_and_response_fields_are_poseidons(api: Api) -> None:
    ours = api.app.openapi()["components"]["schemas"]
    theirs = poseidon_document()
    env = theirs["components"]["schemas"]["ExecutionEnvironment"]
    for name in ("EnvironmentRequest", "ExecutionEnvironment"):
        assert set(ours[name]["properties"]) == set(env["properties"]), name
    assert set(ours["ExecutionEnvironment"]["required"]) == set(env["required"])
    # Poseidon's schema requires them, its request type has no id and takes no ports
    # (its own e2e suite sends neither): so do we
    optional = {"id", "exposedPorts"}
    assert set(ours["EnvironmentRequest"]["required"]) == set(env["required"]) - optional
    post = theirs["paths"]["/runners"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert set(ours["RunnerRequest"]["properties"]) == set(body["properties"])
    assert ours["RunnerRequest"]["required"] == body["required"]
    answer = post["responses"]["200"]["content"]["application/json"]["schema"]
    assert set(ours["RunnerCreated"]["properties"]) == set(answer["properties"])
    port = answer["properties"]["mappedPorts"]["items"]["properties"]
    assert set(ours["MappedPort"]["properties"]) == set(port)
    stats = theirs["paths"]["/statistics/execution-environments"]["get"]["responses"]["200"]
    stat = stats["content"]["application/json"]["schema"]["additionalProperties"]["properties"]
    assert set(ours["EnvironmentStatistics"]["properties"]) == set(stat)
    codes = theirs["components"]["responses"]["InternalServerError"]["content"]
    enum = set(codes["application/json"]["schema"]["properties"]["errorCode"]["enum"])
    assert set(ours["ErrorCode"]["enum"]) - enum == {"NOT_LEADER", "SHUTTING_DOWN"}
