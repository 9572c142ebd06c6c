"""Execution ids across replicas (issue 23 item 2): two services, A and B,
against one simulator, both serving (no leader election), each advertising
its own URL with one shared NRC_REPLICA_SECRET, reached over real sockets as
a client behind a plain load balancer would reach them. A `websocketUrl`
answered by A works when its WebSocket reaches B (B takes the execution from
A over the internal route and runs it), once; an expired, replayed, forged
or altered id is 404 on both, and a forged one makes no outbound call."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import pytest
import requests
from websockets.exceptions import InvalidStatus

from controller.execution.ids import Signer, replica_key
from tests.helpers import wait_until
from tests.support.api_server import ApiServer, sim_settings
from tests.support.ports import free_port
from tests.support.world import AUTH, ENV, World, read_all

SECRET = "replicas-share-this-secret-0123456789"
Pair = tuple[World, World, list[str]]


@contextlib.contextmanager
def replicas(
    make_sim: Any, claims: int = 1, advertise: bool = True, **environ: str
) -> Iterator[tuple[World, World, list[str]]]:
    """A and B, and `claims` runners claimed through A that B has seen.

    Both replicas reconcile (no leader election, so both serve): B starts
    only after A's claims, so that its pool upkeep, racing A's, can never
    take an idle runner A is about to claim (a race of two reconcilers that
    leader election, not this test, is about)."""
    sim = make_sim(nodes=2)
    servers: list[ApiServer] = []

    def start() -> World:
        port = free_port()
        shared = (
            {"NRC_API_ADVERTISE_URL": f"http://127.0.0.1:{port}", "NRC_REPLICA_SECRET": SECRET}
            if advertise
            else {}
        )
        settings = sim_settings(sim, NRC_LEADER_ELECTION="false", **shared, **environ)
        servers.append(ApiServer(settings, port).start())
        return World(sim, servers[-1])

    try:
        a = start()
        a.api.controller.pools.put_environment(ENV)
        runners = [a.claim() for _ in range(claims)]
        b = start()
        wait_until(
            lambda: all(b.runner_status(r)[0] == 200 for r in runners), timeout=10, interval=0.05
        )
        yield a, b, runners
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def pair(make_sim: Any) -> Iterator[tuple[World, World, list[str]]]:
    with replicas(make_sim) as worlds:
        yield worlds


def through(world: World, ws_url: str) -> str:
    """`ws_url` with the host and port of `world`'s replica (the balancer's pick)."""
    parts = urlsplit(ws_url)
    return urlunsplit(parts._replace(netloc=urlsplit(world.api.url).netloc))


def id_of(ws_url: str) -> str:
    return parse_qs(urlsplit(ws_url).query)["executionID"][0]


def with_id(ws_url: str, execution_id: str) -> str:
    parts = urlsplit(ws_url)
    return urlunsplit(parts._replace(query=f"executionID={execution_id}"))


def refusal(world: World, ws_url: str) -> tuple[int, str]:
    """The status and message a connect to `ws_url` is refused with."""
    with pytest.raises(InvalidStatus) as refused, world.connect(ws_url):
        pass
    response = refused.value.response
    return response.status_code, response.body.decode() if response.body else ""


def test_an_id_from_one_replica_runs_through_the_other(pair: Pair) -> None:
    a, b, (runner,) = pair
    ws_url = a.execute(
        runner, 'printf "%s" "$GREETING"; echo; exit 3', environment={"GREETING": "hi"}
    )
    assert urlsplit(ws_url).port == a.api.port
    with b.connect(through(b, ws_url)) as ws:
        run = read_all(ws, time.monotonic())
    assert run.stdout == "hi\r\n"
    assert run.last == {"type": "exit", "data": 3}
    assert run.close_code == 1000
    # The program sees the random part of the id, not a replica's address.
    marker = a.execute(runner, 'echo "$NRC_EXECUTION_ID"')
    with b.connect(through(b, marker)) as ws:
        assert read_all(ws, time.monotonic()).stdout == id_of(marker).split(".")[0] + "\r\n"


def test_a_replayed_id_is_404_on_every_replica(pair: Pair) -> None:
    a, b, (runner,) = pair
    ws_url = a.execute(runner, "echo once")
    with b.connect(through(b, ws_url)) as ws:
        assert read_all(ws, time.monotonic()).stdout == "once\r\n"
    assert refusal(a, ws_url)[0] == 404
    assert refusal(b, through(b, ws_url))[0] == 404
    # The other way round: used on its issuer, then replayed on the other.
    again = a.execute(runner, "echo twice")
    with a.connect(again) as ws:
        assert read_all(ws, time.monotonic()).stdout == "twice\r\n"
    assert refusal(b, through(b, again))[0] == 404


def test_another_runners_path_does_not_spend_the_id(make_sim: Any) -> None:
    with replicas(make_sim, claims=2) as (a, b, (mine, other)):
        check_another_runners_path(a, b, mine, other)


def check_another_runners_path(a: World, b: World, mine: str, other: str) -> None:
    ws_url = a.execute(mine, "echo mine")
    elsewhere = through(b, ws_url).replace(f"/runners/{mine}/", f"/runners/{other}/")
    assert refusal(b, elsewhere)[0] == 404
    with b.connect(through(b, ws_url)) as ws:
        assert read_all(ws, time.monotonic()).stdout == "mine\r\n"


def test_an_expired_id_is_404_on_both(make_sim: Any) -> None:
    with replicas(make_sim, NRC_EXECUTION_ID_TTL="1s") as (a, b, (runner,)):
        first, second = a.execute(runner, "echo late"), a.execute(runner, "echo late")
        executed = time.monotonic()
        # The ids' lifetime is the condition waited for (no connect may try them earlier).
        wait_until(lambda: time.monotonic() > executed + 1.2, timeout=5, interval=0.05)
        assert refusal(b, through(b, first))[0] == 404
        assert refusal(a, second)[0] == 404


@contextlib.contextmanager
def trap() -> Iterator[tuple[str, socket.socket]]:
    """A listening socket that never answers: what connects to it stays in its backlog."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", sock


def was_called(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def test_a_forged_or_altered_id_is_404_without_any_outbound_call(pair: Pair) -> None:
    a, b, (runner,) = pair
    ws_url = a.execute(runner, "echo real")
    real = id_of(ws_url)
    nonce, _, mac = real.split(".")
    with trap() as (url, sock):
        forged = Signer(url, b"a key the replicas do not share!").new_id()
        altered_issuer = f"{nonce}.{Signer(url, b'x' * 32).new_id().split('.')[1]}.{mac}"
        altered_nonce = f"{'0' * 32}.{real.split('.')[1]}.{mac}"
        for execution_id in (forged, altered_issuer, altered_nonce, real[:-1], "x" * 2000):
            status, _ = refusal(b, with_id(through(b, ws_url), execution_id))
            assert status == 404, execution_id
        assert not was_called(sock)
    # The real id was not spent by its forgeries.
    with b.connect(through(b, ws_url)) as ws:
        assert read_all(ws, time.monotonic()).stdout == "real\r\n"


def test_an_issuer_that_cannot_be_reached_is_503(pair: Pair) -> None:
    a, b, (runner,) = pair
    ws_url = a.execute(runner, "echo never")
    shared = replica_key(SECRET, None)
    assert shared is not None
    with trap() as (url, sock):
        # Signed with the replicas' key, naming an address that never answers.
        silent = Signer(url, shared).new_id()
        started = time.monotonic()
        status, message = refusal(b, with_id(through(b, ws_url), silent))
        assert status == 503 and "cannot be reached" in message
        assert 1.5 < time.monotonic() - started < 5, "the take waits 2 s, not longer"
        assert was_called(sock)
    gone = Signer(f"http://127.0.0.1:{free_port()}", shared).new_id()
    assert refusal(b, with_id(through(b, ws_url), gone))[0] == 503


def test_a_draining_issuer_still_answers_the_take(pair: Pair) -> None:
    a, b, (runner,) = pair
    ws_url = a.execute(runner, "echo drained")
    a.api.service.drain.begin()  # as on SIGTERM: A refuses new work
    refused = requests.post(
        a.url(f"/runners/{runner}/execute"), json={"command": "true"}, headers=AUTH, timeout=10
    )
    assert refused.status_code == 503 and refused.json()["errorCode"] == "SHUTTING_DOWN"
    with b.connect(through(b, ws_url)) as ws:
        run = read_all(ws, time.monotonic())
    assert run.stdout == "drained\r\n"
    assert run.last == {"type": "exit", "data": 0}


def test_without_an_advertised_url_ids_stay_on_their_replica(make_sim: Any) -> None:
    with replicas(make_sim, advertise=False) as (a, b, (runner,)):
        ws_url = a.execute(runner, "echo local")
        assert "." not in id_of(ws_url)
        assert refusal(b, through(b, ws_url))[0] == 404
        with a.connect(ws_url) as ws:
            assert read_all(ws, time.monotonic()).stdout == "local\r\n"
