"""AsyncJobWriter, the claims' register on the event loop, against the
simulator: the same request, answers, errors, retries and request metrics
as NomadClient.register_job, through a client agent as in production."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.nomad.aclient import AsyncJobWriter
from controller.nomad.client import NomadClient
from controller.nomad.connection import NomadConnection
from controller.nomad.gateway import IndexConflict, NomadAPIError, NomadUnavailable
from nomadsim import SimServer
from tests.helpers import Http, runner_job
from tests.nomad.test_forwarded import Outcomes
from tests.support.ports import free_port
from tests.support.tls import mutual_tls


@pytest.fixture
def entry(make_sim: Callable[..., SimServer]) -> str:
    server: SimServer = make_sim(servers=3, entry="client")
    return server.address


def writer(address: str, outcomes: Outcomes | None = None, **kwargs: object) -> AsyncJobWriter:
    connection = NomadConnection(address=address, namespace="default")
    return AsyncJobWriter(connection, on_request=outcomes, **kwargs)  # type: ignore[arg-type]


def test_a_register_writes_what_the_client_writes(entry: str) -> None:
    outcomes = Outcomes()
    w = writer(entry, outcomes)

    async def run() -> tuple[int, int]:
        try:
            first = await w.register_job(runner_job("1-a"), enforce_index=0)
            job = {**runner_job("1-a"), "Meta": {"claimed": "yes"}}
            second = await w.register_job(job, enforce_index=first.job_modify_index)
            return first.job_modify_index, second.job_modify_index
        finally:
            await w.aclose()

    first, second = asyncio.run(run())
    assert 0 < first < second
    stored = Http(entry).get("/v1/job/1-a")
    assert stored["Meta"] == {"claimed": "yes"}
    assert stored["JobModifyIndex"] == second
    assert stored["Namespace"] == "default"
    # The synchronous client reads back what the writer wrote.
    spec = NomadClient(address=entry).get_job("1-a")
    assert spec is not None and spec["JobModifyIndex"] == second
    assert outcomes.of("register_job") == [("ok", "200"), ("ok", "200")]


def test_a_forwarded_enforce_index_conflict_is_a_conflict_never_retried(entry: str) -> None:
    outcomes = Outcomes()
    w = writer(entry, outcomes, retry_max_wait_s=0.01)

    async def run() -> None:
        try:
            first = await w.register_job(runner_job("1-b"), enforce_index=0)
            with pytest.raises(IndexConflict, match="rpc error: Enforcing job modify index"):
                await w.register_job(runner_job("1-b"), enforce_index=0)
            with pytest.raises(IndexConflict, match="conflicting job modify index"):
                await w.register_job(runner_job("1-b"), enforce_index=first.job_modify_index + 7)
        finally:
            await w.aclose()

    asyncio.run(run())
    assert outcomes.of("register_job") == [
        ("ok", "200"),
        ("conflict", "500"),
        ("conflict", "500"),
    ]


def test_a_refused_job_is_nomads_error(entry: str) -> None:
    w = writer(entry, retry_attempts=1)

    async def run() -> None:
        try:
            with pytest.raises(NomadAPIError, match='Invalid job type: "no-such-type"') as refused:
                await w.register_job({"ID": "1-c", "Type": "no-such-type"})
            assert refused.value.status == 500  # forwarded: Nomad's `rpc error: …`
        finally:
            await w.aclose()

    asyncio.run(run())


def test_no_nomad_is_unavailable_after_the_retries() -> None:
    outcomes = Outcomes()
    w = writer(f"http://127.0.0.1:{free_port()}", outcomes, retry_attempts=3, retry_max_wait_s=0.01)

    async def run() -> None:
        try:
            with pytest.raises(NomadUnavailable, match="register_job"):
                await w.register_job(runner_job("1-d"), enforce_index=0)
        finally:
            await w.aclose()

    asyncio.run(run())
    assert outcomes.of("register_job") == [("unavailable", "none")] * 3


def test_a_closed_writer_opens_new_connections_on_its_next_loop(entry: str) -> None:
    w = writer(entry)

    async def register(job_id: str) -> int:
        try:
            return (await w.register_job(runner_job(job_id), enforce_index=0)).job_modify_index
        finally:
            await w.aclose()

    assert asyncio.run(register("1-e")) > 0
    assert asyncio.run(register("1-f")) > 0


def test_mutual_tls_token_namespace_and_region_as_configured(tmp_path: Path) -> None:
    """The same TLS (the Nomad CA, a client certificate), ACL token,
    namespace and region as every other call to Nomad."""
    tls = mutual_tls(tmp_path)
    server_ssl, ca_file, cert_file, key_file = tls.server, tls.ca_file, tls.cert_file, tls.key_file
    heads: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        heads.append(head)
        body = b'{"Index": 8, "JobModifyIndex": 7, "Warnings": ""}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    async def run() -> tuple[int, int]:
        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_ssl)
        port = server.sockets[0].getsockname()[1]
        connection = NomadConnection(
            f"https://127.0.0.1:{port}",
            token="secret",
            namespace="students",
            region="eu",
            ca_cert=str(ca_file),
            client_cert=str(cert_file),
            client_key=str(key_file),
        )
        w = AsyncJobWriter(connection, retry_attempts=1)
        try:
            written = await w.register_job(runner_job("1-g"), enforce_index=3)
            untrusted = AsyncJobWriter(
                NomadConnection(f"https://127.0.0.1:{port}", ca_cert=str(ca_file)),
                retry_attempts=1,
            )
            with pytest.raises(NomadUnavailable):  # no client certificate
                await untrusted.register_job(runner_job("1-g"), enforce_index=3)
            await untrusted.aclose()
            return written.index, written.job_modify_index
        finally:
            await w.aclose()
            server.close()
            await server.wait_closed()

    assert asyncio.run(run()) == (8, 7)
    (head,) = heads
    request_line, *lines = head.decode().split("\r\n")
    assert request_line.startswith("PUT /v1/jobs?")
    assert "namespace=students" in request_line and "region=eu" in request_line
    assert "X-Nomad-Token: secret" in lines


def test_a_write_rides_through_a_leader_election(make_sim: Callable[..., SimServer]) -> None:
    """Every request answered 500 `No cluster leader` for 1.5 s, as after a
    leader restart: with a ride-through of 3 s the register lands once a
    leader is back, where five quick attempts alone give up within 0.7 s."""
    server: SimServer = make_sim(servers=3, entry="client")
    outcomes = Outcomes()
    w = writer(server.address, outcomes, retry_max_wait_s=0.2, ride_through_s=3.0)
    server.sim.faults.update({"http_error_rate": 1.0})
    elected = threading.Timer(1.5, server.sim.faults.update, args=({"http_error_rate": 0.0},))

    async def run() -> int:
        try:
            return (await w.register_job(runner_job("1-g"), enforce_index=0)).job_modify_index
        finally:
            await w.aclose()

    elected.start()
    try:
        assert asyncio.run(run()) > 0
    finally:
        elected.cancel()
    seen = outcomes.of("register_job")
    assert seen[-1] == ("ok", "200")
    assert len(seen) > 5 and set(seen[:-1]) == {("error", "500")}


def test_a_ride_through_ends_within_its_bound(make_sim: Callable[..., SimServer]) -> None:
    """No leader for good: the write gives up once the ride-through has
    passed (plus at most one backoff and one answer), with Nomad's error."""
    server: SimServer = make_sim(servers=3, entry="client")
    w = writer(server.address, retry_max_wait_s=0.2, ride_through_s=1.0)
    server.sim.faults.update({"http_error_rate": 1.0})

    async def run() -> float:
        started = time.monotonic()
        try:
            with pytest.raises(NomadAPIError, match="No cluster leader"):
                await w.register_job(runner_job("1-h"), enforce_index=0)
            return time.monotonic() - started
        finally:
            await w.aclose()

    took = asyncio.run(run())
    assert 1.0 <= took < 2.0


def test_the_clients_enforce_index_register_rides_through_as_well(
    make_sim: Callable[..., SimServer],
) -> None:
    """Claims through the synchronous client (a connection budget too small
    for a pool of their own), their ends and losses: with
    `enforced_ride_through_s` an EnforceIndex register outlasts a 1.5 s
    election; a plain register keeps the five quick attempts."""
    server: SimServer = make_sim(servers=3, entry="client")
    outcomes = Outcomes()
    client = NomadClient(
        address=server.address,
        retry_max_wait_s=0.2,
        on_request=outcomes,
        enforced_ride_through_s=3.0,
    )
    server.sim.faults.update({"http_error_rate": 1.0})
    started = time.monotonic()
    with pytest.raises(NomadAPIError, match="No cluster leader"):
        client.register_job(runner_job("1-i"))
    assert time.monotonic() - started < 1.0
    elected = threading.Timer(1.5, server.sim.faults.update, args=({"http_error_rate": 0.0},))
    elected.start()
    try:
        assert client.register_job(runner_job("1-i"), enforce_index=0).job_modify_index > 0
    finally:
        elected.cancel()
    assert outcomes.of("register_job")[-1] == ("ok", "200")
