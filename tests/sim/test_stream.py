"""The event stream: NDJSON frames, heartbeats, topic filters, resume and faults."""

from __future__ import annotations

import time
from collections.abc import Callable

import requests

from nomadsim import SimServer
from tests.helpers import EventReader, Http, runner_job, wait_until


def test_stream_starts_with_a_heartbeat_and_keeps_beating(sim: SimServer) -> None:
    params = {"topic": "Deployment"}  # nothing buffered matches: only heartbeats
    response = requests.get(f"{sim.address}/v1/event/stream", params=params, stream=True, timeout=5)
    lines = response.iter_lines()
    assert next(lines) == b"{}"
    assert next(lines) == b"{}"  # heartbeat_interval_ms=200 in the test fixture
    response.close()


def test_frames_are_one_per_index_with_nomads_envelope(sim: SimServer) -> None:
    http = Http(sim.address)
    reader = EventReader(sim.address, {"index": 1})
    reply = http.register(runner_job("1-a"))
    frame = wait_until(lambda: [f for f in reader.frames if f["Index"] == reply["Index"]])[0]
    assert [(e["Topic"], e["Type"]) for e in frame["Events"]] == [
        ("Job", "JobRegistered"),
        ("Evaluation", "JobRegistered"),
    ]
    job_event, eval_event = frame["Events"]
    assert list(job_event) == [
        "Topic",
        "Type",
        "Key",
        "Namespace",
        "FilterKeys",
        "Index",
        "Payload",
    ]
    assert job_event["FilterKeys"] is None
    assert eval_event["FilterKeys"] == ["1-a", ""]
    assert all(e["Index"] == frame["Index"] for e in frame["Events"])
    indexes = [f["Index"] for f in reader.frames]
    assert indexes == sorted(set(indexes))
    node_events = reader.events("Node")
    assert node_events and all(e["Namespace"] == "" for e in node_events)
    assert {e["Type"] for e in node_events} == {"NodeRegistration"}
    reader.close()


def test_topic_key_matches_key_or_filter_keys(sim: SimServer) -> None:
    http = Http(sim.address)
    by_job = EventReader(sim.address, {"topic": "Allocation:1-a"})
    by_key = EventReader(sim.address, {"topic": "Job:1-b"})
    http.register(runner_job("1-a"))
    http.register(runner_job("1-b"))
    http.running("1-a")
    http.running("1-b")
    wait_until(lambda: by_key.events() and len(by_job.events()) >= 3)
    assert {e["Topic"] for e in by_job.events()} == {"Allocation"}
    assert {e["Payload"]["Allocation"]["JobID"] for e in by_job.events()} == {"1-a"}
    assert {(e["Topic"], e["Key"]) for e in by_key.events()} == {("Job", "1-b")}
    by_job.close()
    by_key.close()


def test_index_is_inclusive_and_resumes(sim: SimServer) -> None:
    http = Http(sim.address)
    http.register(runner_job("1-a"))
    http.running("1-a")
    everything = EventReader(sim.address, {"index": 1})
    wait_until(lambda: len(everything.frames) >= 6)
    middle = everything.frames[3]["Index"]
    resumed = EventReader(sim.address, {"index": middle})
    wait_until(lambda: resumed.frames)
    assert resumed.frames[0]["Index"] == middle
    everything.close()
    resumed.close()


def test_index_older_than_the_buffer_starts_at_the_oldest(
    make_sim: Callable[..., SimServer],
) -> None:
    server = make_sim(event_buffer_size=5)
    http = Http(server.address)
    for i in range(4):
        http.register(runner_job(f"1-{i}"))
    # Every allocation running: no event is published after the reader connects
    # (an allocation still starting added two more frames in a slow run).
    for i in range(4):
        http.running(f"1-{i}")
    quiet = server.sim.broker.published
    assert quiet >= 12
    reader = EventReader(server.address, {"index": 1})
    wait_until(lambda: len(reader.frames) >= 5)
    assert reader.frames[0]["Index"] > 1
    assert len(reader.frames) == 5
    assert server.sim.broker.published == quiet
    reader.close()


def test_stream_cut_and_duplicates(sim: SimServer) -> None:
    http = Http(sim.address)
    faults = {"event_stream_cut_every": 2, "event_duplicate_rate": 1.0}
    assert http.request("PUT", "/_sim/faults", json=faults).ok
    reader = EventReader(sim.address, {"topic": "Job"})
    http.register(runner_job("1-a"))
    http.register(runner_job("1-b"))
    wait_until(lambda: reader.closed)
    indexes = [f["Index"] for f in reader.frames]
    assert len(indexes) == 4 and indexes[0] == indexes[1] and indexes[2] == indexes[3]


def test_heartbeat_loss(sim: SimServer) -> None:
    http = Http(sim.address)
    assert http.request("PUT", "/_sim/faults", json={"heartbeat_loss": True}).ok
    reader = EventReader(sim.address, {"topic": "Job"})
    connected = time.monotonic()
    # Three heartbeat intervals (200 ms each in the fixture) pass without a heartbeat.
    wait_until(lambda: time.monotonic() - connected > 0.6)
    http.register(runner_job("1-a"))
    wait_until(lambda: reader.frames)
    assert reader.heartbeats == 0
    reader.close()


def test_bad_stream_parameters(sim: SimServer) -> None:
    http = Http(sim.address)
    bad_index = http.request("GET", "/v1/event/stream", params={"index": "x"})
    assert bad_index.status_code == 400
    assert bad_index.text.startswith("Unable to parse index")
    # Nomad's parseTopic splits at every colon and refuses more than two parts.
    # (streamed, so that a regression fails instead of reading an endless stream)
    with http.request(
        "GET", "/v1/event/stream", params={"topic": ["Job", "Job:1-a:extra"]}, stream=True
    ) as bad_topic:
        assert bad_topic.status_code == 400
        assert bad_topic.text == (
            "Invalid topic query: error parsing topics: "
            "Invalid key value pair for topic, topic: Job:1-a:extra"
        )


def test_topic_parts_are_taken_as_they_are(sim: SimServer) -> None:
    # `Topic:` is topic and empty key, not an error: the empty key matches
    # what has an empty Key or FilterKey (the DeploymentID of an allocation
    # or evaluation without a deployment), and a Job event has neither.
    http = Http(sim.address)
    reader = EventReader(sim.address, {"topic": ["Job:", "Allocation:"], "index": 1})
    http.register(runner_job("1-e"))
    http.running("1-e")
    wait_until(lambda: reader.events("Allocation"))
    assert {e["Topic"] for e in reader.events()} == {"Allocation"}
    assert all(e["FilterKeys"] == ["1-e", ""] for e in reader.events())
    reader.close()
