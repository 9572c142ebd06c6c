"""The benchmark harness's own arithmetic: targets judged, percentiles, the
JSON each benchmark writes and the table, the floor `ratios` measures
claims against and its replicas for `--follower`. The benchmarks themselves
run with `make bench` and never in the test suite (they report, they do not
fail)."""

from __future__ import annotations

import base64
import hashlib
import json
import random
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from bench import b14_ratios, floorproc, marks, simproc
from bench import profile as bench_profile
from bench.b7_files import StreamedUpload, submission
from bench.common import (
    Figure,
    Http,
    Result,
    machine,
    metric_sum,
    percentile,
    render_table,
    start_ctlproc,
    summary_ms,
    write_result,
)
from controller.model import Claim
from controller.nomad import jobs
from controller.nomad.aclient import AsyncJobWriter
from controller.nomad.client import NomadClient
from controller.nomad.connection import NomadConnection
from nomadsim import SimServer
from tests.helpers import wait_until
from tests.support.processes import child_processes


@pytest.mark.parametrize(
    ("value", "target", "met"),
    [
        (9.9, "<= 10", True),
        (10.0, "<= 10", True),
        (10.1, "<= 10", False),
        (500.0, ">= 500", True),
        (499.9, ">= 500", False),
        (1000.0, "== 1000", True),
        (1001.0, "== 1000", False),
        (5.0, "", None),
        (None, "<= 10", None),
        (5.0, "about 10", None),
    ],
)
def test_a_figure_is_judged_against_its_target(
    value: float | None, target: str, met: bool | None
) -> None:
    assert Figure("f", value, "ms", target).met is met


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)
    summary = summary_ms([0.001, 0.002, 0.003])
    assert summary["n"] == 3
    assert summary["p50_ms"] == pytest.approx(2.0)
    assert summary["max_ms"] == pytest.approx(3.0)
    assert summary["mean_ms"] == pytest.approx(2.0)


def test_a_result_file_holds_machine_facts_figures_and_verdicts(tmp_path: Path) -> None:
    result = Result("claims", "Claim latency")
    result.add("claim p99", 12.3456, "ms", "<= 10")
    result.add("claims/s", 600.0, "1/s", ">= 500")
    result.details["runs"] = [{"n": 1}]
    facts = machine()
    path = write_result(result, facts, tmp_path)
    body = json.loads(path.read_text())
    assert path.name == "claims.json"
    assert body["machine"]["cpu_count"] >= 1
    assert body["machine"]["python"].count(".") == 2
    assert [(f["name"], f["value"], f["met"]) for f in body["figures"]] == [
        ("claim p99", 12.346, False),
        ("claims/s", 600.0, True),
    ]
    assert body["details"] == {"runs": [{"n": 1}]}
    table = render_table([result])
    assert "| claims | claim p99 | 12.3 ms | <= 10 ms | MISSED |" in table
    assert "| claims | claims/s | 600 1/s | >= 500 1/s | met |" in table


def test_metric_sum_adds_the_samples_whose_labels_match() -> None:
    text = "\n".join(
        [
            "# HELP nrc_claims_total Claims.",
            'nrc_claims_total{outcome="claimed"} 7.0',
            'nrc_claims_total{outcome="empty"} 2.0',
            'nrc_claims_total_created{outcome="claimed"} 1.7e9',
        ]
    )
    assert metric_sum(text, "nrc_claims_total") == 9.0
    assert metric_sum(text, "nrc_claims_total", {"outcome": "empty"}) == 2.0
    assert metric_sum(text, "nrc_missing") == 0.0


def test_a_submission_deletes_everything_and_lists_its_directories_first() -> None:
    body = json.loads(submission(files=7, directories=3, size=10))
    assert body["delete"] == ["./*"]
    paths = [item["path"] for item in body["copy"]]
    assert paths[:3] == ["dir00/", "dir01/", "dir02/"]
    assert paths[3:5] == ["dir00/file00000.txt", "dir01/file00001.txt"]
    assert len(paths) == 10
    assert all(len(base64.b64decode(item["content"])) == 10 for item in body["copy"][3:])


@pytest.mark.parametrize("size", [0, 1, 5, 6, 7, 12, 13])
def test_a_streamed_upload_is_the_json_of_its_file(size: int) -> None:
    upload = StreamedUpload("up/a.bin", size, seed=3, block=6)
    chunks = list(upload.chunks())
    content = (random.Random(3).randbytes(6) * 3)[:size]
    assert json.loads(b"".join(chunks)) == {
        "copy": [{"path": "up/a.bin", "content": base64.b64encode(content).decode()}]
    }
    assert upload.length == sum(map(len, chunks))
    assert upload.sha256 == hashlib.sha256(content).hexdigest()
    assert all(len(c) <= 8 for c in chunks[1:-1])  # one block's base64 at a time


def test_a_profile_is_cpu_ms_per_unit_by_function(tmp_path: Path) -> None:
    sampled = {
        "rounds": 10,
        "cpu_s": 0.5,
        "own": [["a.py:1:f", 0.3], ["b.py:2:g", 0.2]],
        "inclusive": [["main", 0.5], ["a.py:1:f", 0.3]],
    }
    table = bench_profile.per_unit(sampled, 100)
    assert table["cpu_ms_per_unit"] == 5.0
    assert table["own_ms"] == [["a.py:1:f", 3.0], ["b.py:2:g", 2.0]]
    path = bench_profile.write("claims", "claim", table, tmp_path)
    assert json.loads(path.read_text())["unit"] == "claim"
    text = path.with_suffix(".txt").read_text()
    assert "controller CPU per claim: 5.000 ms" in text and "3.000  a.py:1:f" in text


def test_py_spy_samples_of_the_gil_holder_are_time_by_function_own_and_inclusive() -> None:
    lines = [
        "main (ctl.py:3);serve (a.py:10);send (b.py:5) 6",
        "main (ctl.py:3);serve (a.py:12);serve (a.py:40) 2",  # recursion counts once
        "main (ctl.py:3);work (c.py:7) 2",
        "",  # py-spy ends with a blank line
    ]
    profile = bench_profile.charged(lines, sample_s=0.1)
    assert profile["rounds"] == 10 and profile["sampled_s"] == pytest.approx(1.0)
    assert dict(profile["own"]) == pytest.approx(
        {"b.py:send": 0.6, "a.py:serve": 0.2, "c.py:work": 0.2}
    )
    inclusive = dict(profile["inclusive"])
    assert inclusive == pytest.approx(
        {"ctl.py:main": 1.0, "a.py:serve": 0.8, "b.py:send": 0.6, "c.py:work": 0.2}
    )
    table = bench_profile.per_unit({"sampler": "py-spy --gil", "cpu_s": 2.0, **profile}, 100)
    assert table["sampler"] == "py-spy --gil"
    assert (table["cpu_ms_per_unit"], table["sampled_ms_per_unit"]) == (20.0, 10.0)


def test_a_bare_claim_write_is_the_register_a_claim_makes_with_its_time_and_index() -> None:
    env = b14_ratios.bare_environment()
    spec = jobs.runner_job(jobs.template_job(env), env, "bare-x")
    spec["JobModifyIndex"] = 7
    parts = b14_ratios.write_body(spec, "alloc-1")
    body = json.loads(b14_ratios.fill(parts, 1_700_000_000_000_000_001, 42))
    assert body["EnforceIndex"] is True
    assert body["JobModifyIndex"] == 42
    assert body["Job"]["ID"] == "bare-x"
    assert body["Job"]["Namespace"] == "default"
    claim = jobs.runner_from_job(body["Job"], env.id).claim
    assert claim is not None
    assert (claim.alloc_id, claim.claimed_at) == ("alloc-1", 1_700_000_000_000_000_001)
    # A runner id names an environment; the bare jobs' ids do not, so the
    # controller leaves them alone.
    assert jobs.env_id_of(body["Job"]["ID"]) is None


def test_the_floor_serves_claims_with_the_controllers_stack_and_write(sim: SimServer) -> None:
    """bench.floorproc, in process over the simulator: a claim is the
    controller's body model, the register with the claim in the job's meta
    (EnforceIndex with the index the last write answered), the answer model."""
    nomad = Http(sim.address)
    b14_ratios.BareJobs(nomad, 2, b14_ratios.FLOOR_PREFIX)
    free = floorproc.read_jobs(sim.address, b14_ratios.FLOOR_PREFIX)
    writer = AsyncJobWriter(NomadConnection(address=sim.address), connections=2)
    with TestClient(floorproc.app(writer, free)) as api:
        answers = [api.post("/api/v1/runners", json=b14_ratios.CLAIM) for _ in range(3)]
        refused = api.post("/api/v1/runners", json={"executionEnvironmentId": "x"})
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert refused.status_code == 400, refused.text
    ids = [a.json()["runnerId"] for a in answers]
    assert ids[0] == ids[2] != ids[1]  # handed back after its write, taken again
    for job_id in set(ids):
        spec = nomad.json("GET", f"/v1/job/{job_id}")
        assert jobs.runner_from_job(spec, b14_ratios.ENV_ID).claim is not None, spec


def test_the_floor_and_its_refill_registers_one_job_after_each_claim_and_deletes_them(
    sim: SimServer,
) -> None:
    """bench.floorproc's refill (`ratios`, "the floor and its refill"): while
    on, each claim is followed by one new runner job that is no runner of
    the controller's; switched off, it waits for them and deletes them all."""
    nomad = Http(sim.address)
    b14_ratios.BareJobs(nomad, 2, b14_ratios.FLOOR_PREFIX)
    free = floorproc.read_jobs(sim.address, b14_ratios.FLOOR_PREFIX)
    writer = AsyncJobWriter(NomadConnection(address=sim.address), connections=2)
    refill = floorproc.Refill(
        floorproc.refill_job, NomadClient(NomadConnection(address=sim.address)).deregister_job
    )

    def made() -> list[str]:
        listed = nomad.json("GET", f"/v1/jobs?prefix={floorproc.REFILL_PREFIX}")
        return [j["ID"] for j in listed if not j.get("Stop")]

    with TestClient(floorproc.app(writer, free, refill=refill)) as api:
        assert api.post("/api/v1/runners", json=b14_ratios.CLAIM).status_code == 200
        assert made() == []  # refilling is off until switched on
        assert api.get("/_bench/refill?on=1").status_code == 200
        for _ in range(3):
            assert api.post("/api/v1/runners", json=b14_ratios.CLAIM).status_code == 200
        wait_until(lambda: len(made()) == 3, timeout=10)
        for job_id in made():
            assert jobs.env_id_of(job_id) is None  # never one of the controller's runners
            spec = nomad.json("GET", f"/v1/job/{job_id}")
            assert jobs.runner_from_job(spec, 0).claim is None  # an idle runner's layout
        assert api.get("/_bench/refill?on=0").status_code == 200
        assert made() == []


def test_the_chain_alone_is_the_controllers_two_execs_of_an_execution(sim: SimServer) -> None:
    """`ratios`' chain alone: the command through the wrapper with a TTY and
    root's reader of its stderr FIFO, opened at once straight to Nomad; the
    exit code is the command's, stdout comes through the terminal and stderr
    only through the reader."""
    nomad = Http(sim.address)
    (job_id,) = b14_ratios.BareJobs(nomad, 1).ids

    def running() -> bool:
        stubs = nomad.json("GET", f"/v1/job/{job_id}/allocations")
        return any(a["ClientStatus"] == "running" for a in stubs)

    wait_until(running, timeout=10)
    alloc = b14_ratios.allocation_of(nomad, job_id)
    wrapper = (sim.call(lambda: sim.sim.setuser_path), "user")
    command = "echo hi; echo oops >&2; exit 3"
    seconds, code, size, stderr = b14_ratios.chain_exec(alloc, command, wrapper)
    assert (code, size, stderr) == (3, len(b"hi\r\n"), b"oops\n")
    assert seconds > 0
    _, code, size = b14_ratios.bare_exec(alloc, ["sh", "-c", "echo hi"])
    assert (code, size) == (0, 3)  # the bare exec has no terminal: "hi\n"


def test_the_chain_alone_sits_between_the_bare_exec_and_the_execution() -> None:
    """`ratios`' chain figures: the chain against the bare exec, the
    execution against the chain (latency and stdout), and its process count."""

    def load(ms: float) -> b14_ratios.Load:
        out = b14_ratios.Load()
        out.record(ms / 1000, True)
        return out

    execs: dict[str, object] = {}
    for how in ("open", "serial"):
        execs.update({how: [load(33.0)], f"{how}_bare": [load(10.0)], f"{how}_chain": [load(30.0)]})
    execs["stdout_mb_per_s"] = {"controller": [38.0], "bare": [50.0], "chain": [40.0]}
    execs["forks_chain"] = {"per_run": 6, "min": 6}
    result = Result("ratios", "test")
    b14_ratios.chain_figures(result, execs, {"chain execs": {"simulator": 34.0}})
    values = {f.name: f.value for f in result.figures}
    chain = "the chain alone (the controller's two execs, straight to Nomad)"
    assert values[f"{chain}: p50 ÷ bare exec p50, 10/s on 10 runners"] == 3.0
    assert values["execution p50 ÷ the chain alone p50, serial (1 client)"] == 1.1
    assert values["stdout MB/s of the chain alone ÷ a bare exec"] == 0.8
    assert values["stdout MB/s of one execution ÷ the chain alone"] == 0.95
    assert values["processes started per run of the chain alone"] == 6
    assert values["simulator CPU per run of the chain alone"] == 34.0


def test_the_floor_beside_the_upkeep_claims_each_idle_runner_once(sim: SimServer) -> None:
    """bench.floorproc with `BENCH_FLOOR_IDLE_OF`: the idle runners of the
    environment whose allocation runs, each claimed once with the claim a
    controller writes (its running allocation), then 503; a runner already
    claimed is left alone."""
    nomad = Http(sim.address)
    env_id = b14_ratios.ENV_ID
    runners = b14_ratios.BareJobs(nomad, 3, f"{env_id}-").ids

    def running() -> dict[str, str]:
        allocs = nomad.json("GET", "/v1/allocations")
        return {a["JobID"]: a["ID"] for a in allocs if a["ClientStatus"] == "running"}

    wait_until(lambda: set(runners) <= running().keys(), timeout=30)
    taken, *idle = runners
    spec = nomad.json("GET", f"/v1/job/{taken}")
    claimed = jobs.with_claim(spec, Claim(timeout=0, alloc_id="a", claimed_at=1))
    nomad.json("PUT", "/v1/jobs", {"Job": claimed})
    free = floorproc.read_idle_runners(sim.address, env_id)
    assert sorted(job[0]["ID"] for job in free) == sorted(idle)
    writer = AsyncJobWriter(NomadConnection(address=sim.address), connections=2)
    with TestClient(floorproc.app(writer, free, once=True)) as api:
        answers = [api.post("/api/v1/runners", json=b14_ratios.CLAIM) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 503], [a.text for a in answers]
    assert sorted(a.json()["runnerId"] for a in answers[:2]) == sorted(idle)
    allocs = running()
    for job_id in idle:
        claim = jobs.runner_from_job(nomad.json("GET", f"/v1/job/{job_id}"), env_id).claim
        assert claim is not None and claim.alloc_id == allocs[job_id], claim


def test_ratios_follower_talks_to_a_replica_that_does_not_lead(sim: SimServer) -> None:
    """`ratios --follower`: two replicas with leader election on over one
    Nomad; the first leads once elected and the second, started after it,
    follows, so the clients' requests reach a replica that does no upkeep."""
    with child_processes() as procs:
        first, _ = b14_ratios.start_replica(procs, sim.address, {}, None)
        wait_until(lambda: b14_ratios.role(first) == "leader", timeout=30)
        second, _ = b14_ratios.start_replica(procs, sim.address, {}, None)
        assert b14_ratios.role(second) == "follower"
        assert b14_ratios.role(first) == "leader"


def test_the_api_observing_nothing_hands_out_what_it_saw_first_and_keeps_no_pool_up(
    sim: SimServer,
) -> None:
    """`ratios`, "the API observing nothing" (`bench.ctlproc.ApiOnly`): the
    controller's own API over the runners of its first look, each once; it
    does not lead, so it creates none, and once it has looked it sends
    Nomad nothing but the claims' writes."""
    nomad = Http(sim.address)
    env_id = b14_ratios.ENV_ID
    template = jobs.template_job(simproc.environment(env_id, 3))
    nomad.json("PUT", "/v1/jobs", {"Job": template})
    runners = b14_ratios.BareJobs(nomad, 3, f"{env_id}-").ids

    def running() -> set[str]:
        allocs = nomad.json("GET", "/v1/allocations")
        return {a["JobID"] for a in allocs if a["ClientStatus"] == "running"}

    wait_until(lambda: set(runners) <= running(), timeout=30)
    with child_processes() as procs:
        proc, api = start_ctlproc(
            procs, sim.address, {"BENCH_API_ONLY": "1", "NRC_RESYNC_INTERVAL": "50ms"}
        )
        assert b14_ratios.role(proc) == "follower"
        api.json("GET", "/_bench/probe?reset=1")
        answers = [api.request("POST", "/api/v1/runners", b14_ratios.CLAIM) for _ in range(4)]
        probe = api.json("GET", "/_bench/probe")
    assert [status for status, _ in answers[:3]] == [200] * 3
    assert sorted(json.loads(body)["runnerId"] for _, body in answers[:3]) == sorted(runners)
    assert answers[3][0] != 200, answers[3]
    assert set(probe["requests"]) == {"PUT /v1/jobs"}, probe["requests"]
    listed = nomad.json("GET", f"/v1/jobs?prefix={env_id}-")
    assert sorted(j["ID"] for j in listed) == sorted(runners)


def test_a_claims_way_is_taken_apart_at_its_marks_and_a_claim_missing_one_is_left_out() -> None:
    client = {"r1": (10.0, 10.5, 20.0), "r2": (30.0, 30.0, 31.0)}
    api = {"r1": (11.0, 18.0), "r2": (30.1, 30.9)}
    writes = {"r1": (12.0, 17.0)}  # r2's write was not marked
    nomad = {"r1": (13.0, 15.0), "r2": (30.2, 30.3)}
    [row] = marks.segments(client, api, writes, nomad)
    assert row == {
        "total": 10.0,
        "late": 0.5,
        "to_api": 0.5,
        "before_write": 1.0,
        "to_nomad": 1.0,
        "in_nomad": 2.0,
        "from_nomad": 2.0,
        "after_write": 1.0,
        "back": 2.0,
    }
    assert sum(row[k] for k in marks.SEGMENTS) == row["total"]


def test_the_breakdown_is_the_mean_ms_of_the_faster_half_and_the_slowest_percent() -> None:
    rows = [dict.fromkeys(("total", *marks.SEGMENTS), t / 1000) for t in range(1, 201)]
    random.Random(3).shuffle(rows)
    out = marks.breakdown(rows)
    assert out["faster half"]["claims"] == 100
    assert out["faster half"]["total"] == pytest.approx(50.5)
    assert out["slowest 1 %"]["claims"] == 2
    assert out["slowest 1 %"]["in_nomad"] == pytest.approx(199.5)
    assert marks.breakdown([]) == {}


def test_the_api_marks_claims_by_runner_only_while_switched_on() -> None:
    app = FastAPI()

    @app.post("/api/v1/runners")
    def claim() -> dict[str, str]:
        return {"runnerId": "1-abc"}

    @app.post("/api/v1/other")
    def other() -> dict[str, str]:
        return {"runnerId": "1-other"}

    recorder = marks.Recorder()
    app.add_middleware(marks.ApiMarks, recorder=recorder)
    client = TestClient(app)
    assert client.post("/api/v1/runners").status_code == 200
    assert recorder.take(True) == {}
    before = marks.now()
    assert client.post("/api/v1/runners").json() == {"runnerId": "1-abc"}
    client.post("/api/v1/other")
    recorded = recorder.take(False)
    assert list(recorded) == ["1-abc"]
    seen, answered = recorded["1-abc"]
    assert before <= seen <= answered <= marks.now()
    client.post("/api/v1/runners")
    assert recorder.take(False) == {}


def test_the_simulator_marks_enforce_index_registers_by_job_id() -> None:
    app = FastAPI()

    @app.put("/v1/jobs")
    async def register(request: Request) -> dict[str, int]:
        await request.body()  # as the simulator reads it before it answers
        return {"JobModifyIndex": 7}

    recorder = marks.Recorder()
    app.add_middleware(marks.WriteMarks, recorder=recorder)
    client = TestClient(app)
    recorder.take(True)
    claim = {"Job": {"Region": "global", "ParentID": "", "ID": "1-abc"}, "EnforceIndex": True}
    assert client.put("/v1/jobs", json=claim).json() == {"JobModifyIndex": 7}
    client.put("/v1/jobs", json={"Job": {"ID": "1-new"}})  # no EnforceIndex: not marked
    assert list(recorder.take(False)) == ["1-abc"]
