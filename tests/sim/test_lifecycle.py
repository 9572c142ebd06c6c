"""Lifecycles of real Nomad that the simulator reproduces, checked over HTTP."""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable
from typing import Any

import pytest

from nomadsim import SimServer
from tests.helpers import SECOND, EventReader, Http, runner_job, wait_until
from tests.support.sim import TOPOLOGY


def task_events(alloc: dict[str, Any], task: str = "default-task") -> list[str]:
    return [e["Type"] for e in alloc["TaskStates"][task]["Events"]]


def replacement(http: Http, job_id: str, old_id: str) -> dict[str, Any]:
    """The running allocation of a one-allocation job that replaced `old_id`."""
    return wait_until(
        lambda: [
            a
            for a in http.allocs(job_id)
            if a["ID"] != old_id and a["ClientStatus"] == "running" and a["DesiredStatus"] == "run"
        ]
    )[0]


def test_register_places_and_starts_with_nomad_task_events(sim: SimServer) -> None:
    http = Http(sim.address)
    reply = http.register(runner_job("1-a"))
    assert reply["EvalID"] and reply["JobModifyIndex"] == reply["Index"]
    assert http.get("/v1/job/1-a")["Status"] in ("pending", "running")
    (stub,) = http.running("1-a")
    alloc = http.alloc(stub["ID"])
    assert task_events(alloc) == ["Received", "Task Setup", "Driver", "Started"]
    assert "PreviousAllocation" not in alloc  # omitted when empty
    assert http.get("/v1/job/1-a")["Status"] == "running"
    ev = http.get(f"/v1/evaluation/{reply['EvalID']}")
    assert (ev["TriggeredBy"], ev["Status"], ev["Type"]) == ("job-register", "complete", "batch")
    ports = alloc["AllocatedResources"]["Shared"]["Ports"]
    assert ports[0]["To"] == 8080 and 20000 <= ports[0]["Value"] <= 32000


def test_meta_change_in_count_zero_group_keeps_allocation_but_task_change_replaces(
    sim: SimServer,
) -> None:
    http = Http(sim.address)
    http.register(runner_job("1-b"))
    (first,) = http.running("1-b")
    http.register(runner_job("1-b", meta={"used": "true", "timeout": "60"}))
    job = http.get("/v1/job/1-b")
    assert job["Version"] == 1
    wait_until(lambda: http.allocs("1-b")[0]["JobVersion"] == 1)
    (same,) = http.allocs("1-b")
    assert same["ID"] == first["ID"] and same["ClientStatus"] == "running"
    assert same["TaskStates"]["default-task"]["Restarts"] == 0

    http.register(runner_job("1-b", image="python:3.13"))
    second = replacement(http, "1-b", first["ID"])
    assert second["ID"] != first["ID"]
    old = http.alloc(first["ID"])
    assert old["DesiredDescription"] == "alloc is being updated due to job update"


def test_unchanged_spec_is_not_a_new_version(sim: SimServer) -> None:
    http = Http(sim.address)
    first = http.register(runner_job("1-c"))
    again = http.register(runner_job("1-c"))
    assert again["JobModifyIndex"] == first["JobModifyIndex"]
    assert http.get("/v1/job/1-c")["Version"] == 0
    assert again["EvalID"] != first["EvalID"]


def test_deregister_stops_allocations_and_job_becomes_dead(sim: SimServer) -> None:
    http = Http(sim.address)
    http.register(runner_job("1-d"))
    (alloc,) = http.running("1-d")
    reply = http.request("DELETE", "/v1/job/1-d").json()
    ev = http.get(f"/v1/evaluation/{reply['EvalID']}")
    assert (ev["TriggeredBy"], ev["Type"]) == ("job-deregister", "service")
    done = wait_until(lambda: (a := http.alloc(alloc["ID"]))["ClientStatus"] == "complete" and a)
    assert done["DesiredStatus"] == "stop"
    assert done["DesiredDescription"] == "alloc not needed due to job update"
    assert task_events(done)[-2:] == ["Killing", "Killed"] or "Killed" in task_events(done)
    job = wait_until(lambda: (j := http.get("/v1/job/1-d"))["Status"] == "dead" and j)
    assert job["Stop"] is True
    missing = http.request("DELETE", "/v1/job/never-existed")
    assert missing.status_code == 200 and missing.json()["EvalID"] == ""


def test_purge_removes_job_and_allocations_with_only_job_and_eval_events(sim: SimServer) -> None:
    http = Http(sim.address)
    http.register(runner_job("1-e"))
    (alloc,) = http.running("1-e")
    reader = EventReader(sim.address, {"index": 1})
    wait_until(lambda: reader.events("Allocation", alloc["ID"]))
    reply = http.request("DELETE", "/v1/job/1-e", params={"purge": "true"}).json()
    assert http.request("GET", "/v1/job/1-e").text == "job not found"
    assert http.request("GET", f"/v1/allocation/{alloc['ID']}").status_code == 404
    frame = wait_until(lambda: [f for f in reader.frames if f["Index"] == reply["Index"]])[0]
    assert {(e["Topic"], e["Type"]) for e in frame["Events"]} == {
        ("Job", "JobDeregistered"),
        ("Evaluation", "JobDeregistered"),
    }
    wait_until(lambda: http.get(f"/v1/evaluation/{reply['EvalID']}")["Status"] == "complete")
    later = [f for f in reader.frames if f["Index"] >= reply["Index"]]
    assert not [e for f in later for e in f["Events"] if e["Topic"] == "Allocation"]
    reader.close()


# Through a client agent (the suite's entry) a server's error comes back
# wrapped, as Nomad's RPC layer wraps it.
FORWARDED = "rpc error: " if TOPOLOGY["entry"] == "client" else ""


@pytest.mark.parametrize(
    ("existing", "enforce_index", "message"),
    [
        (True, 0, "Enforcing job modify index 0: job already exists"),
        (
            True,
            999,
            "Enforcing job modify index 999: job exists with conflicting job modify index: {m}",
        ),
        (False, 7, "Enforcing job modify index 7: job does not exist"),
    ],
)
def test_enforce_index_conflicts_are_500_with_nomads_text(
    sim: SimServer, existing: bool, enforce_index: int, message: str
) -> None:
    http = Http(sim.address)
    modify = 0
    if existing:
        modify = http.register(runner_job("1-f"))["JobModifyIndex"]
        # A stopped but not purged job still exists for this check.
        http.request("DELETE", "/v1/job/1-f")
        modify = http.get("/v1/job/1-f")["JobModifyIndex"]
    body = {"Job": runner_job("1-f"), "EnforceIndex": True, "JobModifyIndex": enforce_index}
    response = http.request("PUT", "/v1/job/1-f", json=body)
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == FORWARDED + message.format(m=modify)
    ok = {"Job": runner_job("1-f"), "EnforceIndex": True, "JobModifyIndex": modify}
    assert http.request("PUT", "/v1/job/1-f", json=ok).status_code == 200


def first_index(reader: EventReader, alloc_id: str, client_status: str) -> int:
    """Wait until the stream reader has seen the allocation reach a client status."""
    return wait_until(
        lambda: min(
            (i for i, _, c, _ in alloc_events(reader, alloc_id) if c == client_status), default=0
        )
    )


def drain(http: Http, node_id: str, deadline_ns: int) -> None:
    body = {
        "DrainSpec": {"Deadline": deadline_ns, "IgnoreSystemJobs": False},
        "MarkEligible": False,
    }
    response = http.request("POST", f"/v1/node/{node_id}/drain", json=body)
    assert response.status_code == 200, response.text


def alloc_events(reader: EventReader, alloc_id: str) -> list[tuple[int, str, str, str]]:
    return [
        (
            e["Index"],
            e["Type"],
            e["Payload"]["Allocation"].get("ClientStatus", ""),
            e["Payload"]["Allocation"].get("DesiredStatus", ""),
        )
        for e in reader.events("Allocation", alloc_id)
    ]


def test_drain_production_ordering(sim: SimServer) -> None:
    """The production migration (docs/architecture.md): new running ~startup later,
    old complete only after it."""
    http = Http(sim.address)
    http.register(runner_job("1-g"))
    (old,) = http.running("1-g")
    reader = EventReader(sim.address, {"topic": "Allocation:1-g", "index": 1})
    wait_until(lambda: reader.events("Allocation", old["ID"]))
    drain(http, old["NodeID"], -1)
    new = wait_until(lambda: [a for a in http.allocs("1-g") if a["ID"] != old["ID"]])[0]
    # Frames arrive in index order: once the stream shows both transitions,
    # every earlier frame (the migration's PlanResult) is in the reader too.
    new_running = first_index(reader, new["ID"], "running")
    old_complete = first_index(reader, old["ID"], "complete")
    assert new_running < old_complete
    wait_until(lambda: http.get(f"/v1/node/{old['NodeID']}")["DrainStrategy"] is None)
    plan = [
        f
        for f in reader.frames
        if {e["Key"] for e in f["Events"]} >= {old["ID"], new["ID"]}
        and f["Events"][0]["Type"] == "PlanResult"
    ]
    assert len(plan) == 1, "old and new allocation arrive in one PlanResult frame"
    by_key = {e["Key"]: e["Payload"]["Allocation"] for e in plan[0]["Events"]}
    assert by_key[old["ID"]]["DesiredStatus"] == "stop"
    assert by_key[old["ID"]]["DesiredDescription"] == "alloc is being migrated"
    assert by_key[old["ID"]]["ClientStatus"] == "running"
    assert by_key[old["ID"]]["NextAllocation"] == new["ID"]
    assert (by_key[new["ID"]]["ClientStatus"], by_key[new["ID"]]["DesiredStatus"]) == (
        "pending",
        "run",
    )
    payloads = [e["Payload"]["Allocation"] for e in reader.events("Allocation")]
    assert all("PreviousAllocation" not in p for p in payloads)
    assert all("Job" not in p for p in payloads)
    node = http.get(f"/v1/node/{old['NodeID']}")
    assert node["SchedulingEligibility"] == "ineligible"
    assert node["LastDrain"]["Status"] == "complete"
    assert new["NodeID"] != old["NodeID"]
    reader.close()


def test_drain_client_ordering(sim: SimServer) -> None:
    """Nomad's client path: the new allocation waits for the old one and names it."""
    http = Http(sim.address)
    assert http.request("PUT", "/_sim/faults", json={"migration_ordering": "client"}).ok
    http.register(runner_job("1-h"))
    (old,) = http.running("1-h")
    reader = EventReader(sim.address, {"topic": "Allocation:1-h", "index": 1})
    drain(http, old["NodeID"], -1)
    new = replacement(http, "1-h", old["ID"])
    assert http.alloc(new["ID"])["PreviousAllocation"] == old["ID"]
    old_complete = first_index(reader, old["ID"], "complete")
    new_running = first_index(reader, new["ID"], "running")
    assert old_complete < new_running
    reader.close()


def test_a_migrated_allocation_completes_when_its_replacement_is_stopped_first(
    make_sim: Callable[..., SimServer],
) -> None:
    """Production ordering: the old allocation waits for its replacement to
    run; a replacement stopped before it runs (the job stopped: the controller
    ending a `migrated` claim) leaves the old one nothing to wait for, and it
    completes as any stopped allocation does (chaos seed 2 found it running
    with desired status stop for ever)."""
    sim = make_sim(nodes=2, startup_delay_ms=300.0, migration_ordering="production")
    http = Http(sim.address)
    job_id = "7-00000000-0000-4000-8000-000000000001"
    http.register(runner_job(job_id))
    (old,) = http.running(job_id)
    r = http.request(
        "POST",
        f"/v1/node/{old['NodeID']}/drain",
        json={"DrainSpec": {"Deadline": -1, "IgnoreSystemJobs": False}},
    )
    assert r.status_code == 200, r.text

    def migrating() -> bool:
        alloc: dict[str, Any] = http.alloc(old["ID"])
        return bool(alloc["DesiredStatus"] == "stop" and alloc.get("NextAllocation"))

    wait_until(migrating, timeout=5)
    # Stop the job while the replacement is still starting (startup takes 300 ms).
    assert http.request("DELETE", f"/v1/job/{job_id}").status_code == 200
    wait_until(lambda: http.alloc(old["ID"])["ClientStatus"] == "complete", timeout=3)


def test_drain_migrates_batch_only_at_deadline(make_sim: Callable[..., SimServer]) -> None:
    server = make_sim(time_scale=0.001)
    http = Http(server.address)
    http.register(runner_job("1-i"))
    (old,) = http.running("1-i")
    drain(http, old["NodeID"], 200 * SECOND)  # 200 ms at this time scale
    node = http.get(f"/v1/node/{old['NodeID']}")
    assert node["DrainStrategy"]["Deadline"] == 200 * SECOND
    assert node["SchedulingEligibility"] == "ineligible"
    assert http.alloc(old["ID"])["DesiredStatus"] == "run"  # not before the deadline
    wait_until(lambda: http.alloc(old["ID"]).get("DesiredDescription") == "alloc is being migrated")


def test_service_drain_respects_max_parallel(make_sim: Callable[..., SimServer]) -> None:
    server = make_sim(nodes=2)
    http = Http(server.address)
    job = runner_job("web", job_type="service", count=4)
    http.register(job)
    allocs = http.running("web", 4)
    node_id = allocs[0]["NodeID"]
    on_node = {a["ID"] for a in allocs if a["NodeID"] == node_id}
    reader = EventReader(server.address, {"topic": "Allocation:web", "index": 1})
    drain(http, node_id, 3600 * SECOND)
    wait_until(lambda: http.get(f"/v1/node/{node_id}")["DrainStrategy"] is None)

    # max_parallel 1: one allocation marked per step, and the next step only
    # once the previous replacement runs.
    def migration_marks() -> list[tuple[int, str]]:
        return [
            (f["Index"], e["Key"])
            for f in reader.frames
            for e in f["Events"]
            if e["Type"] == "AllocationUpdateDesiredStatus" and e["Topic"] == "Allocation"
        ]

    marks = wait_until(lambda: m if len(m := migration_marks()) == len(on_node) else [])
    assert sorted(k for _, k in marks) == sorted(on_node)
    assert len({i for i, _ in marks}) == len(marks)
    first_mark, first_id = marks[0]
    replacement = http.alloc(first_id)["NextAllocation"]
    running_at = first_index(reader, replacement, "running")
    assert first_mark < running_at < marks[1][0]
    assert len(http.running("web", 4)) == 4
    reader.close()


def test_alloc_stop_replaces_like_a_migration(sim: SimServer) -> None:
    http = Http(sim.address)
    http.register(runner_job("1-j"))
    (old,) = http.running("1-j")
    reply = http.request("POST", f"/v1/allocation/{old['ID']}/stop").json()
    assert set(reply) == {"EvalID", "Index"}
    assert http.get(f"/v1/evaluation/{reply['EvalID']}")["TriggeredBy"] == "alloc-stop"
    new = replacement(http, "1-j", old["ID"])
    stopped = http.alloc(old["ID"])
    assert stopped["DesiredTransition"]["Migrate"] is True
    assert stopped["NextAllocation"] == new["ID"]
    assert http.request("POST", "/v1/allocation/nope/stop").text == "allocation not found"
    assert http.request("GET", "/v1/allocation/nope").text == "alloc not found"


def test_oom_restarts_then_fails_then_reschedules(make_sim: Callable[..., SimServer]) -> None:
    # 0.01: the reschedule's 5 s delay is 50 ms, longer than the scheduler can
    # lag under load; at 5 ms a late failure handling found the delay already
    # over and rescheduled at once, without the follow-up evaluation checked below.
    server = make_sim(time_scale=0.01)
    http = Http(server.address)
    restart = {"Attempts": 1, "Interval": 3600 * SECOND, "Delay": 15 * SECOND, "Mode": "fail"}
    http.register(runner_job("1-k", restart=restart))
    (alloc,) = http.running("1-k")
    assert http.request("POST", f"/_sim/allocation/{alloc['ID']}/oom").ok
    restarted = wait_until(
        lambda: (
            (a := http.alloc(alloc["ID"]))["TaskStates"]["default-task"]["Restarts"] == 1
            and a["ClientStatus"] == "running"
            and a
        )
    )
    events = restarted["TaskStates"]["default-task"]["Events"]
    terminated = next(e for e in events if e["Type"] == "Terminated")
    assert terminated["Details"]["oom_killed"] == "true"
    assert terminated["Details"]["exit_code"] == "137"
    assert terminated["Message"] == "OOM Killed"
    assert [e["Type"] for e in events][-3:] == ["Terminated", "Restarting", "Started"]

    assert http.request("POST", f"/_sim/allocation/{alloc['ID']}/oom").ok
    failed = wait_until(lambda: (a := http.alloc(alloc["ID"]))["ClientStatus"] == "failed" and a)
    state = failed["TaskStates"]["default-task"]
    assert state["State"] == "dead" and state["Failed"] is True
    assert state["Events"][-1]["Type"] == "Not Restarting"
    # Batch default reschedule policy: 1 attempt, 5 s delay (50 ms here) via a follow-up eval.
    replaced = wait_until(lambda: http.alloc(alloc["ID"]).get("NextAllocation"))
    new = http.alloc(str(replaced))
    assert new["PreviousAllocation"] == alloc["ID"]
    assert new["RescheduleTracker"]["Events"][0]["PrevAllocID"] == alloc["ID"]
    old = http.alloc(alloc["ID"])
    assert old["DesiredStatus"] == "stop"
    assert old["DesiredDescription"] == "alloc was rescheduled because it failed"
    triggers = {e["TriggeredBy"] for e in http.get("/v1/job/1-k/evaluations")}
    assert "alloc-failure" in triggers
    assert any(e.get("WaitUntil") for e in http.get("/v1/job/1-k/evaluations"))


def test_crash_is_a_normal_exit_code(sim: SimServer) -> None:
    http = Http(sim.address)
    http.register(runner_job("1-l"))
    (alloc,) = http.running("1-l")
    assert http.request("POST", f"/_sim/allocation/{alloc['ID']}/crash").ok
    got = http.alloc(alloc["ID"])
    terminated = next(
        e for e in got["TaskStates"]["default-task"]["Events"] if e["Type"] == "Terminated"
    )
    assert terminated["Details"]["oom_killed"] == "false"
    assert terminated["Details"]["exit_code"] == "1"
    assert got["TaskStates"]["default-task"]["Events"][-1]["Type"] == "Restarting"


def rfc3339_ns(value: str) -> int:
    """Go's RFC3339Nano UTC time as unix nanoseconds."""
    base, _, frac = value.removesuffix("Z").partition(".")
    seconds = calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S"))
    return seconds * SECOND + int(frac.ljust(9, "0"))


def test_restart_counts_at_restarting_and_restamps_started_at(
    make_sim: Callable[..., SimServer],
) -> None:
    # Nomad's task runner: the Restarting event moves the task to `pending`
    # and counts the restart (Restarts, LastRestart = the event's time) at the
    # start of the delay; Started after the delay sets a new StartedAt.
    server = make_sim(time_scale=0.001)
    http = Http(server.address)
    restart = {"Attempts": 2, "Interval": 3600 * SECOND, "Delay": 40 * SECOND, "Mode": "fail"}
    http.register(runner_job("1-r", restart=restart))
    (alloc,) = http.running("1-r")
    first = http.alloc(alloc["ID"])["TaskStates"]["default-task"]
    first_started = next(e for e in first["Events"] if e["Type"] == "Started")
    assert rfc3339_ns(first["StartedAt"]) == first_started["Time"]
    assert (first["Restarts"], first["LastRestart"]) == (0, None)
    reader = EventReader(server.address, {"topic": f"Allocation:{alloc['ID']}"})
    assert http.request("POST", f"/_sim/allocation/{alloc['ID']}/crash").ok

    def states() -> list[tuple[str, dict[str, Any]]]:
        return [
            (
                e["Payload"]["Allocation"]["ClientStatus"],
                e["Payload"]["Allocation"]["TaskStates"]["default-task"],
            )
            for e in reader.events("Allocation", alloc["ID"])
            if e["Type"] == "AllocationUpdated"
        ]

    # The client update that records Restarting, as the stream delivered it
    # (so it is observed during the delay, however long a request takes).
    status, delaying = wait_until(
        lambda: [(c, t) for c, t in states() if t["Events"][-1]["Type"] == "Restarting"]
    )[0]
    assert [e["Type"] for e in delaying["Events"]][-2:] == ["Terminated", "Restarting"]
    restarting = delaying["Events"][-1]
    assert (status, delaying["State"]) == ("pending", "pending")
    assert delaying["Restarts"] == 1
    assert rfc3339_ns(delaying["LastRestart"]) == restarting["Time"]
    assert delaying["StartedAt"] == first["StartedAt"]  # not started again yet

    status, again = wait_until(
        lambda: [
            (c, t)
            for c, t in states()
            if [e["Type"] for e in t["Events"]][-2:] == ["Restarting", "Started"]
        ]
    )[0]
    assert (status, again["State"]) == ("running", "running")
    assert [e["Type"] for e in again["Events"]][-3:] == ["Terminated", "Restarting", "Started"]
    restarted = again["Events"][-1]
    assert again["Restarts"] == 1  # counted once, at Restarting
    assert again["LastRestart"] == delaying["LastRestart"]
    assert rfc3339_ns(again["StartedAt"]) == restarted["Time"]
    assert restarted["Time"] - restarting["Time"] >= 40 * SECOND // 1000
    assert rfc3339_ns(again["StartedAt"]) > rfc3339_ns(first["StartedAt"])
    assert again["FinishedAt"] is None
    reader.close()


def test_node_down_loses_allocations_and_replaces_them(sim: SimServer) -> None:
    http = Http(sim.address)
    http.register(runner_job("1-m"))
    (old,) = http.running("1-m")
    assert http.request("POST", f"/_sim/node/{old['NodeID']}/down").ok
    lost = wait_until(lambda: (a := http.alloc(old["ID"]))["ClientStatus"] == "lost" and a)
    assert lost["DesiredDescription"] == "alloc is lost since its node is down"
    new = replacement(http, "1-m", old["ID"])
    assert http.alloc(new["ID"])["PreviousAllocation"] == old["ID"]
    assert new["NodeID"] != old["NodeID"]
    assert http.get(f"/v1/node/{old['NodeID']}")["Status"] == "down"
    assert http.request("POST", f"/_sim/node/{old['NodeID']}/up").ok
    assert http.get(f"/v1/node/{old['NodeID']}")["Status"] == "ready"


def test_unplaceable_allocations_wait_in_a_blocked_eval(make_sim: Callable[..., SimServer]) -> None:
    server = make_sim(nodes=1, node_cpu_mhz=250)
    http = Http(server.address)
    http.register(runner_job("big", count=3))
    http.running("big", 2)
    summary = http.get("/v1/job/big/summary")["Summary"]["default-group"]
    assert summary["Queued"] == 1 and summary["Running"] == 2
    evals = http.get("/v1/job/big/evaluations")
    assert any(e["Status"] == "blocked" and e["TriggeredBy"] == "queued-allocs" for e in evals)
    http.register(runner_job("big", count=2))  # frees nothing, but no longer needs the third
    assert len(http.running("big", 2)) == 2


def test_same_seed_same_calls_same_ids_and_placements(make_sim: Callable[..., SimServer]) -> None:
    def run(server: SimServer) -> list[tuple[str, str, str]]:
        http = Http(server.address)
        for i in range(4):
            http.register(runner_job(f"1-{i}"))
            http.running(f"1-{i}")
        return [
            (a["ID"], a["NodeID"], a["EvalID"]) for i in range(4) for a in http.allocs(f"1-{i}")
        ]

    assert run(make_sim(seed=42)) == run(make_sim(seed=42))
    assert run(make_sim(seed=42)) != run(make_sim(seed=43))


def test_a_client_lives_a_restart_before_the_servers_hear_of_it(
    make_sim: Callable[..., SimServer],
) -> None:
    # Nomad's client sends its allocations' changes every 200 ms and the
    # server commits them in 50 ms batches: the task restarts on its node (a
    # fresh container, a fresh file system) before the API shows the restart.
    # A long window, so the first read falls inside it however slow the test.
    server = make_sim(client_sync_ms=3000.0)
    http = Http(server.address)
    restart = {"Attempts": 2, "Interval": 3600 * SECOND, "Delay": 0, "Mode": "fail"}
    http.register(runner_job("1-s", restart=restart))
    (alloc,) = http.running("1-s", timeout=10)
    task_dir = server.sim.task_dir(alloc["ID"])
    assert task_dir is not None
    (task_dir / "marker").write_text("before the restart")
    assert http.request("POST", f"/_sim/allocation/{alloc['ID']}/crash").ok

    def fresh_container() -> bool:
        again = server.sim.task_dir(alloc["ID"])
        return again is not None and not (again / "marker").exists()

    wait_until(fresh_container)
    seen = http.alloc(alloc["ID"])
    assert seen["ClientStatus"] == "running"
    assert seen["TaskStates"]["default-task"]["Restarts"] == 0
    reported = wait_until(
        lambda: (a := http.alloc(alloc["ID"]))["TaskStates"]["default-task"]["Restarts"] == 1 and a,
        timeout=10,
    )
    assert reported["ClientStatus"] == "running"
    assert [e["Type"] for e in reported["TaskStates"]["default-task"]["Events"]][-3:] == [
        "Terminated",
        "Restarting",
        "Started",
    ]
