"""The parts of the execution data plane one API needs, wired together."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from controller.dataplane.runners import ClaimedRunners
from controller.execution.command import ExecSettings, command_size
from controller.execution.ids import Signer
from controller.execution.relay import Execs, Relay, RelaySettings, Session
from controller.execution.store import ExecutionStore, Limits
from controller.nomad.exec import ExecRejected
from controller.reconcile.facade import Pools


@dataclass(frozen=True)
class ExecutionSettings:
    """From the NRC_EXEC_* / NRC_EXECUTION_* settings."""

    exec: ExecSettings = field(default_factory=ExecSettings)
    id_ttl_s: float = 300.0
    broken_as_exit_zero: bool = False
    signal_loss_window_s: float = 0.5
    limits: Limits = field(default_factory=Limits)
    loss_settle_s: float = 0.85  # NRC_LOSS_SETTLE, for executions and files alike
    client_sync_s: float = 0.25  # NRC_NOMAD_CLIENT_SYNC
    # NRC_API_ADVERTISE_URL with the replicas' key: ids other replicas can take.
    ids: Signer | None = None


@dataclass
class Executions:
    relay: Relay
    store: ExecutionStore
    runners: ClaimedRunners  # the file routes ask the same one


class NoExec:
    """An `Execs` for a controller whose Nomad gateway cannot exec (in-memory
    fakes in tests): every execution ends with an `error` frame saying so."""

    async def open(
        self, alloc_id: str, task: str, command: Sequence[str], *, tty: bool = False
    ) -> Session:
        raise ExecRejected("this controller was started without a Nomad exec client")


def executions(
    controller: Pools, execs: Execs | None, settings: ExecutionSettings | None = None
) -> Executions:
    s = settings or ExecutionSettings()
    runners = ClaimedRunners(controller, s.loss_settle_s, s.client_sync_s)
    relay = Relay(
        execs if execs is not None else NoExec(),
        runners,
        controller.metrics,
        RelaySettings(
            exec=s.exec,
            broken_as_exit_zero=s.broken_as_exit_zero,
            signal_loss_window_s=s.signal_loss_window_s,
        ),
    )
    store = ExecutionStore(
        controller.clock,
        s.id_ttl_s,
        s.limits,
        lambda request: command_size(request, s.exec),
        new_id=s.ids.new_id if s.ids is not None else None,
    )
    return Executions(relay, store, runners)
