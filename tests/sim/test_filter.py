"""`?filter=` on the job and allocation lists: go-bexpr's grammar and rules,
evaluated on the whole Job / Allocation, as Nomad's paginator does."""

from __future__ import annotations

from typing import Any

import pytest

from nomadsim import SimServer
from nomadsim.bexpr import FilterEvalError, FilterSyntaxError, parse
from tests.helpers import Http, runner_job, wait_until

# -- the expression language ---------------------------------------------------------

JOB: dict[str, Any] = {
    "ID": "7-web",
    "Name": "7-web",
    "Priority": 50,
    "Stop": False,
    "Datacenters": ["dc1", "dc2"],
    "Meta": {"team": "a b", "empty": ""},
    "TaskGroups": [{"Name": "default-group", "Count": 1}],
    "Periodic": None,
    "Weight": 1.5,
}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('ID == "7-web"', True),
        ("ID == `7-web`", True),
        ('ID != "7-web"', False),
        ("Priority == 50", True),
        ('Priority == "50"', True),  # the value is coerced to the field's type
        ("Stop == false", True),
        ("Stop == 0", True),  # strconv.ParseBool accepts 0/1/t/f/true/false/...
        ("Weight == 1.5", True),
        ('"dc2" in Datacenters', True),
        ('Datacenters contains "dc3"', False),
        ('Datacenters not contains "dc3"', True),
        ('"team" in Meta', True),  # a map: its keys
        ('Name contains "we"', True),  # a string: a substring
        ('Meta["team"] == "a b"', True),
        ("Meta.team is not empty", True),
        ("Meta.empty is empty", True),
        ('Meta.missing == "x"', False),  # an absent key: == is false ...
        ('Meta.missing != "x"', True),  # ... and != true
        ("Meta.missing is empty", True),
        ("Periodic is empty", True),  # nil
        ("TaskGroups.0.Count == 1", True),
        ('Name matches "^7-"', True),
        ('Name not matches "^8-"', True),
        ('ID == "x" or ID == "7-web"', True),
        ('ID == "x" or ID == "y" and Stop == false', False),  # and binds tighter
        ('(ID == "x" or ID == "y") or Stop == false', True),
        ('not ID == "x"', True),
        ('not not ID == "7-web"', True),
        ('  ( ID == "7-web" )  ', True),
        ('Name == "7-\\u0077eb"', True),  # Go escapes in double quotes
    ],
)
def test_expressions_evaluate_as_go_bexpr(expression: str, expected: bool) -> None:
    assert parse(expression).matches(JOB) is expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("NotValid", "expected a match operator"),
        ("ID ==", "expected a value"),
        ('(ID == "x"', "Unmatched parentheses"),
        ('ID == "x', "Unterminated string literal"),
        ("Priority == 5x", "Invalid number literal"),
        ("Priority > 5", "expected a match operator"),  # no ordering operators in go-bexpr
        ('["a"] contains "a"', "not supported"),
    ],
)
def test_bad_expressions_do_not_parse(expression: str, message: str) -> None:
    with pytest.raises(FilterSyntaxError, match=message) as raised:
        parse(expression)
    assert str(raised.value).startswith("1:")  # go-bexpr's line:column prefix


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ('Unknown == "x"', 'couldn\'t find key: struct field with name "Unknown"'),
        ('Priority == "high"', 'strconv.ParseInt: parsing "high"'),
        ('Priority contains "5"', "Cannot perform in/contains operations on type int"),
        ('TaskGroups == "x"', "unable to find suitable primitive comparison function"),
        ('Priority matches "5"', "not convertible to []byte"),
    ],
)
def test_expressions_that_cannot_be_evaluated_raise(expression: str, message: str) -> None:
    with pytest.raises(FilterEvalError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse(expression).matches(JOB)


def test_an_or_of_equalities_on_one_field_is_recognised() -> None:
    found = parse('JobID == "a" or JobID == "b" or JobID == "c"').equality_set("JobID")
    assert found == frozenset({"a", "b", "c"})
    assert parse('JobID == "a" and JobID == "b"').equality_set("JobID") is None
    assert parse('JobID == "a" or ID == "b"').equality_set("JobID") is None


# -- over HTTP -----------------------------------------------------------------------


@pytest.fixture
def cluster(sim: SimServer) -> tuple[Http, list[str]]:
    http = Http(sim.address)
    ids = [f"7-job{n}" for n in range(5)]
    for job_id in ids:
        http.register(runner_job(job_id))
    for job_id in ids:
        http.running(job_id)
    return http, ids


def _filter(http: Http, path: str, expression: str, **params: Any) -> Any:
    response = http.request("GET", path, params={"filter": expression, **params})
    assert response.status_code == 200, response.text
    return response


def test_allocations_of_some_jobs(cluster: tuple[Http, list[str]]) -> None:
    http, ids = cluster
    wanted = ids[1:3]
    expression = " or ".join(f'JobID == "{j}"' for j in wanted)
    params = {"resources": "true", "task_states": "true"}
    everything = http.get("/v1/allocations", **params)
    filtered = _filter(http, "/v1/allocations", expression, **params)
    # The same entries, byte for byte, in the same order as the unfiltered list.
    assert filtered.json() == [a for a in everything if a["JobID"] in wanted]
    assert int(filtered.headers["X-Nomad-Index"]) == int(
        http.request("GET", "/v1/allocations").headers["X-Nomad-Index"]
    )


def test_any_expression_over_whole_allocations(cluster: tuple[Http, list[str]]) -> None:
    http, ids = cluster
    http.request("POST", f"/_sim/allocation/{http.allocs(ids[0])[0]['ID']}/crash")
    wait_until(lambda: http.allocs(ids[0])[0]["TaskStates"]["default-task"]["Restarts"] == 1)
    # Job is a field of the Allocation struct (not of the list stub).
    restarted = _filter(
        http,
        "/v1/allocations",
        'Job.Type == "batch" and TaskStates["default-task"].Restarts == 1',
    ).json()
    assert [a["JobID"] for a in restarted] == [ids[0]]
    # A field every Allocation has, zero in this one (omitted from its JSON).
    assert len(_filter(http, "/v1/allocations", "PreviousAllocation is empty").json()) == 5


def test_jobs_by_id_and_by_any_field(cluster: tuple[Http, list[str]]) -> None:
    http, ids = cluster
    expression = f'ID == "{ids[4]}" or ID == "{ids[0]}" or ID == "7-missing"'
    found = _filter(http, "/v1/jobs", expression).json()
    assert [j["ID"] for j in found] == [ids[0], ids[4]]  # in the list's order
    assert found == [j for j in http.get("/v1/jobs") if j["ID"] in (ids[0], ids[4])]
    # The filter sees the whole Job: its task groups are not in the stub.
    groups = _filter(http, "/v1/jobs", 'TaskGroups.1.Name == "config"').json()
    assert len(groups) == 5


@pytest.mark.parametrize(
    ("expression", "text"),
    [
        (
            "NotValid",
            "failed to create result paginator: failed to read filter expression: 1:9 (8): ",
        ),
        ('Unknown == "x"', "failed to read result page: error finding value in datum: "),
    ],
)
def test_filter_errors_are_400_as_nomad_words_them(
    cluster: tuple[Http, list[str]], expression: str, text: str
) -> None:
    http, _ = cluster
    for path in ("/v1/jobs", "/v1/allocations"):
        response = http.request("GET", path, params={"filter": expression})
        assert response.status_code == 400
        assert response.text.startswith(text), response.text


def test_cached_list_entries_follow_every_write(cluster: tuple[Http, list[str]]) -> None:
    """Encoded entries are reused between lists; a write must show at once."""
    http, ids = cluster
    before = {a["ID"]: a for a in http.get("/v1/allocations")}
    alloc = http.allocs(ids[2])[0]
    http.request("POST", f"/_sim/allocation/{alloc['ID']}/crash")
    wait_until(
        lambda: (
            {a["ID"]: a for a in http.get("/v1/allocations")}[alloc["ID"]]["ModifyIndex"]
            > before[alloc["ID"]]["ModifyIndex"]
        )
    )
    after = {a["ID"]: a for a in http.get("/v1/allocations")}
    assert after[alloc["ID"]]["TaskStates"]["default-task"]["Restarts"] == 1
    assert all(after[i] == before[i] for i in before if i != alloc["ID"])
