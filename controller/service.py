"""The controller as a running service: the Nomad gateway and event stream,
the reconcile loop, and the HTTP API on uvicorn — against a real Nomad
(`run`) or against the simulator started in the same process (`dev`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from fastapi import FastAPI
from pydantic import SecretStr

from controller.api import head_deadline
from controller.api.app import create_app
from controller.api.drain import Drain, describe_uses, run_drain
from controller.api.executions import WebSocketUrls
from controller.api.guard import allowed_hosts
from controller.api.replicas import IssuerClient
from controller.api.uploads import UploadSettings
from controller.config import Settings
from controller.execution.relay import Relay
from controller.execution.service import executions
from controller.files.service import Files
from controller.gcpacing import CollectorPacer, Pacing
from controller.logs import configure_logging
from controller.metrics import Metrics
from controller.model import Environment
from controller.nomad.aclient import AsyncJobWriter
from controller.nomad.budget import AgentSlots
from controller.nomad.client import NomadClient
from controller.nomad.errors import CLAIM_RIDE_THROUGH_S
from controller.nomad.exec import ExecClient
from controller.nomad.nodes import NodeDirectory
from controller.nomad.stream import EventStream
from controller.nomad.template_file import load_template_file
from controller.poseidon_config import startup_warnings
from controller.reconcile.loop import (
    EVENT_TOPICS,
    Controller,
    EventsCallback,
    EventSource,
    StreamFactory,
)

log = logging.getLogger(__name__)

DEMO_ENVIRONMENT = Environment(
    id=1,
    image="python:3.12-slim",
    cpu_limit=100,
    memory_limit=256,
    network_access=False,
    exposed_ports=(),
    prewarming_pool_size=5,
)


@dataclass
class Service:
    settings: Settings
    controller: Controller
    app: FastAPI
    drain: Drain
    relay: Relay
    # With ids other replicas take: how many issued here still wait (the drain waits).
    ids_waiting: Callable[[], int] | None = None
    # The claims' writer on the API's event loop, closed on that loop at shutdown.
    claim_writer: AsyncJobWriter | None = None


def build(settings: Settings, nomad_address: str | None = None) -> Service:
    """Wire the parts; nothing starts yet. Raises TemplateFileError when
    NRC_TEMPLATE_JOB_FILE cannot carry runners."""
    metrics = Metrics()
    connection = settings.nomad_connection(nomad_address)
    budget = AgentSlots(settings.budget_settings(), connection.address)
    gateway = NomadClient(
        connection,
        timeout_s=settings.nomad_timeout_s,
        on_request=metrics.record_request,
        connections=budget.shares.http_pool,
        # Claims through this client (a budget too small for their own pool),
        # their ends and recorded losses ride through an election too.
        enforced_ride_through_s=CLAIM_RIDE_THROUGH_S,
    )
    factory: StreamFactory | None = None
    if settings.event_stream:

        def factory(
            on_events: EventsCallback,
            on_state: Callable[[bool], None],
            start_index: int,
        ) -> EventSource:
            # Only connecting is bounded by NRC_NOMAD_TIMEOUT: the read timeout
            # must outlast Nomad's heartbeats, so it keeps EventStream's default.
            return EventStream(
                connection,
                connect_timeout_s=settings.nomad_timeout_s,
                topics=EVENT_TOPICS,
                on_events=on_events,
                on_state=on_state,
                start_index=start_index,
            )

    base = (
        load_template_file(settings.template_job_file, gateway)
        if settings.template_job_file is not None
        else None
    )
    controller_settings = dataclasses.replace(
        settings.controller_settings(), template=settings.template_policy(base)
    )
    # Claims write on the API's event loop through a pool of their own (but
    # with a budget too small to split, through the client's, on a thread).
    claim_pool = budget.shares.claim_pool
    claim_writer = (
        AsyncJobWriter(
            connection,
            timeout_s=settings.nomad_timeout_s,
            # A claim rides through a leader election rather than failing a run.
            ride_through_s=CLAIM_RIDE_THROUGH_S,
            on_request=metrics.record_request,
            connections=claim_pool,
        )
        if claim_pool
        else None
    )
    controller = Controller(
        gateway,
        controller_settings,
        metrics=metrics,
        stream_factory=factory,
        async_gateway=claim_writer,
    )
    exec_client = ExecClient(
        connection,
        nodes=(
            NodeDirectory(gateway, observed=controller.pools.observed_node)
            if settings.nomad_exec_on_node
            else None
        ),
        connect_timeout_s=settings.nomad_timeout_s,
        on_request=metrics.record_request,
        budget=budget,
    )
    execution_settings = settings.execution_settings()
    execution = executions(controller.pools, exec_client, execution_settings)
    drain = Drain()
    signer = execution_settings.ids
    hosts = allowed_hosts((settings.api_allowed_hosts or "").split(","), settings.api_host)
    if signer is not None and hosts is not None:
        # The other replicas' takes arrive with the advertised URL's Host.
        hosts = hosts | {urlsplit(signer.url).hostname or ""}
    app = create_app(
        controller.pools,
        api_token=settings.api_auth_token,
        allowed_hosts=hosts,
        allowed_origins=tuple((settings.api_allowed_origins or "").split(","))
        if settings.api_allowed_origins
        else (),
        max_pool_size=settings.max_pool_size,
        pool_alert_threshold=settings.pool_alert_threshold,
        execution=execution,
        websocket_urls=WebSocketUrls(
            scheme=settings.api_websocket_scheme,
            trust_proxy_headers=settings.api_trust_proxy_headers,
        ),
        file_service=Files(exec_client, metrics, settings.file_settings()),
        upload_settings=UploadSettings(
            max_concurrent=settings.files_max_concurrent_uploads,
            idle_timeout_s=settings.files_upload_idle_timeout_s,
        ),
        max_upload_bytes=settings.files_max_upload_bytes,
        drain=drain,
        issuers=IssuerClient(signer, controller.pools.clock) if signer is not None else None,
    )
    ids_waiting = execution.store.waiting if signer is not None else None
    return Service(settings, controller, app, drain, execution.relay, ids_waiting, claim_writer)


class _Server(uvicorn.Server):
    """uvicorn, telling us once it listens (so `dev` prints working URLs), and
    exiting 0 on SIGINT/SIGTERM: a requested stop is a clean stop (uvicorn
    itself re-raises the signal after shutting down). The first signal starts
    the service's drain (controller/api/drain.py), which tells uvicorn to
    exit when it is done; a second ends at once."""

    def __init__(
        self,
        config: uvicorn.Config,
        on_started: Callable[[str], None] | None,
        service: Service | None = None,
    ) -> None:
        super().__init__(config)
        self._on_started = on_started
        self._service = service
        self._draining = False
        self._tasks: set[asyncio.Task[None]] = set()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        service = self._service
        if service is None or self._draining or not self.started:
            if service is not None:
                service.relay.end_all()
            self.force_exit = self._draining
            self.should_exit = True
            return
        self._draining = True
        log.info("draining: %s received, new work refused", signal.Signals(sig).name)
        # A signal handler runs between two steps of the loop: the drain is
        # handed to the loop (which this wakes) rather than started here.
        asyncio.get_running_loop().call_soon_threadsafe(self._start_drain, service)

    def _start_drain(self, service: Service) -> None:
        task = asyncio.ensure_future(self._drain(service))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self, service: Service) -> None:
        settings = service.settings
        controller = service.controller

        async def step_down() -> None:
            await asyncio.to_thread(controller.step_down)

        relay = service.relay
        uses = controller.pools.uses
        log.info("draining: runners in use: %s", describe_uses(uses.in_flight()))
        try:
            ended = await run_drain(
                service.drain,
                step_down=step_down,
                end_executions=relay.end_all,
                executions_ended=relay.wait_background,
                grace_s=settings.shutdown_grace_s,
                ids_waiting=service.ids_waiting,
            )
            log.info(
                "drained: %s",
                "everything in flight ended"
                if ended
                else f"grace of {settings.shutdown_grace_s:g}s over, executions still running "
                f"ended; runners still in use: {describe_uses(uses.in_flight())}",
            )
        except Exception:
            log.exception("the drain failed; stopping now")
            relay.end_all()
        finally:
            self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        stop = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in stop}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets: Any = None) -> None:
        await super().shutdown(sockets=sockets)
        writer = self._service.claim_writer if self._service is not None else None
        if writer is not None:
            await writer.aclose()

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self._on_started is not None:
            host, port = self.config.host, self.config.port
            for server in self.servers:
                for sock in server.sockets:
                    port = sock.getsockname()[1]
            self._on_started(f"http://{host}:{port}")


def serve(service: Service, on_started: Callable[[str], None] | None = None) -> int:
    """Run until SIGINT/SIGTERM; stop the loop cleanly; 0 on a clean stop."""
    s = service.settings
    config = uvicorn.Config(
        service.app,
        host=s.api_host,
        port=s.api_port,
        log_config=None,  # our handlers, our format
        access_log=False,
        timeout_graceful_shutdown=5,
        http=head_deadline.protocol(s.api_request_head_timeout_s),
    )
    server = _Server(config, on_started, service)
    pacer = CollectorPacer(
        Pacing(s.gc_freeze_interval_s, s.gc_full_interval_s),
        on_pause=service.controller.metrics.gc_pause_seconds.observe,
        ready=lambda: service.controller.observer.observed_once,
    )
    # Process-wide, like the collector's pacing: the API's event loop shares
    # the interpreter with the passes, refreshes and the event stream.
    sys.setswitchinterval(s.gil_switch_interval_s)
    try:
        with _stoppable_start():
            service.controller.start()
        pacer.start()
        server.run()
    except _StopBeforeServing:
        log.info("stopped before serving")
        return 0
    finally:
        pacer.stop()
        service.controller.stop()
    if not server.started:
        log.error("the API could not listen on %s:%d", s.api_host, s.api_port)
        return 1
    return 0


class _StopBeforeServing(Exception):
    """SIGTERM or SIGINT before the API serves: nothing is in flight to drain."""


def _stop_before_serving(sig: int, frame: FrameType | None) -> None:
    raise _StopBeforeServing(signal.Signals(sig).name)


@contextlib.contextmanager
def _stoppable_start() -> Iterator[None]:
    """Until uvicorn takes the signals over, a SIGTERM (a deploy that stops
    a replica still starting) ends the start-up cleanly, exit 0, rather
    than by the signal's default action."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _stop_before_serving) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _secrets(settings: Settings) -> list[str]:
    """The values no log line may show."""
    nomad = settings.nomad_token.get_secret_value() if settings.nomad_token else None
    replica = settings.replica_secret.get_secret_value() if settings.replica_secret else None
    return [s for s in (settings.api_auth_token, nomad, replica) if s]


def _warn_about_poseidon_variables() -> None:
    """POSEIDON_* variables are never applied (one way to configure the
    controller, not two), but whoever set them meant something: say, once
    each, what it is called here."""
    for line in startup_warnings(os.environ):
        log.warning("%s", line)


def run(settings: Settings) -> int:
    configure_logging(settings.log_level, settings.effective_log_format, _secrets(settings))
    _warn_about_poseidon_variables()
    log.info("controller against Nomad at %s", settings.nomad_addr)
    if settings.api_token is None:
        log.warning(
            "NRC_API_TOKEN is not set: the API on %s takes requests without authentication",
            settings.api_host,
        )
    replicas = settings.replicas_problem()
    if replicas is not None:
        log.warning("%s", replicas)
    try:
        with _stoppable_start():
            service = build(settings)
    except _StopBeforeServing:
        log.info("stopped before serving")
        return 0
    return serve(service)


def dev(settings: Settings, topology: dict[str, Any] | None = None) -> int:
    """The simulator in this process, the controller against it, a demo pool.
    `topology` shapes the simulated cluster (SimConfig's servers, entry and
    connection limits; its production defaults when not given)."""
    from nomadsim import SimConfig, SimServer

    # The simulator runs commands on this host: never without a token, or a
    # web page the developer opens could run them (one is made up).
    if settings.api_token is None:
        settings = replace_settings(settings, api_token=SecretStr(secrets.token_urlsafe(24)))
    configure_logging(settings.log_level, settings.effective_log_format, _secrets(settings))
    _warn_about_poseidon_variables()
    sim = SimServer(
        SimConfig(nodes=3, startup_delay_ms=500.0, stop_delay_ms=200.0, **(topology or {}))
    )
    sim.start()
    try:
        # One replica, nothing to elect against. The simulator runs commands on
        # this host, which has no /sbin/setuser: its stand-in takes that place
        # unless the operator chose a wrapper.
        changes: dict[str, Any] = {"leader_election": False}
        if "exec_unprivileged_wrapper" not in settings.model_fields_set:
            setuser = sim.call(lambda: sim.sim.setuser_path)
            changes["exec_unprivileged_wrapper"] = f"{shlex.quote(str(setuser))} user"
        service = build(replace_settings(settings, **changes), sim.address)

        def started(api: str) -> None:
            service.controller.pools.put_environment(DEMO_ENVIRONMENT)
            print(dev_banner(api, sim.address, service.settings.api_auth_token), flush=True)

        return serve(service, started)
    finally:
        sim.stop()


def replace_settings(settings: Settings, **changes: Any) -> Settings:
    return settings.model_copy(update=changes)


def dev_banner(api: str, nomad: str, token: str | None) -> str:
    """What `dev` prints once the API listens: its URLs, then commands that
    work as pasted into a shell (each sends the token; the curl lines print
    the HTTP status after the answer)."""
    env = DEMO_ENVIRONMENT
    auth = f"-H {shlex.quote('Authorization: Bearer ' + token)} " if token else ""
    status = "-w ' (HTTP %{http_code})\\n' "
    body = (
        '{"id": 2, "image": "python:3.12-slim", "prewarmingPoolSize": 3, '
        '"cpuLimit": 100, "memoryLimit": 256, "networkAccess": false, "exposedPorts": []}'
    )
    claim = f'{{"executionEnvironmentId": {env.id}, "inactivityTimeout": 60}}'
    json_header = "-H 'Content-Type: application/json' "
    smoke = f"{smoke_program()} smoke --url {api}/api/v1"
    if token:
        # `=`: a made-up token may begin with `-`, which argparse would take for an option.
        smoke += f" --token={shlex.quote(token)}"
    return "\n".join(
        [
            "nomad-runner-controller dev: the controller against an in-process Nomad simulator",
            f"  API        {api}/api/v1  (OpenAPI: {api}/openapi.json)",
            f"  metrics    {api}/metrics",
            f"  simulator  {nomad}  (NOMAD_ADDR for the nomad CLI or python-nomad)",
            f"  demo environment {env.id}: pool of {env.prewarming_pool_size} runners",
            *(
                [f"  API token  {token}  (Authorization: Bearer or Poseidon-Token)"]
                if token
                else []
            ),
            "",
            "# every step CodeOcean takes, checked: claim a runner, copy a file, run a command",
            "# over the WebSocket (stdin, stdout, stderr, exit code), list, download, release",
            smoke,
            "# create an environment",
            f"curl -s -X PUT {status}{auth}{json_header}-d {shlex.quote(body)} "
            f"{api}/api/v1/execution-environments/2",
            "# claim a runner",
            f"RUNNER_ID=$(curl -s -X POST {auth}{json_header}-d {shlex.quote(claim)} "
            f"{api}/api/v1/runners | python3 -c 'import json,sys; print(json.load(sys.stdin)"
            '["runnerId"])\'); echo $RUNNER_ID',
            "# start a command in it: the websocketUrl answered runs it once connected with the",
            "# token header and streams its output as JSON frames (smoke above does that)",
            f'curl -s -X POST {status}{auth}{json_header}-d \'{{"command": "echo hello"}}\' '
            f'{api}/api/v1/runners/"$RUNNER_ID"/execute',
            "# release it",
            f'curl -s -X DELETE {status}{auth}{api}/api/v1/runners/"$RUNNER_ID"',
            "",
            "Ctrl-C stops everything.",
        ]
    )


def smoke_program() -> str:
    """How to start this installation's `smoke` from any directory: the
    entry point beside this interpreter (a venv's bin/, the image's), else
    this interpreter with `-m controller`."""
    script = os.path.join(os.path.dirname(sys.executable), "nomad-runner-controller")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return shlex.quote(script)
    return f"{shlex.quote(sys.executable)} -m controller"
