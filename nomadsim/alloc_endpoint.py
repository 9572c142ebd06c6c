"""The server's allocation operations: migrate and stop (Nomad's
nomad/alloc_endpoint.go and the drainer's AllocUpdateDesiredTransition) and
exec (nomad/client_alloc_endpoint.go: the checks made before a client runs
the command)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from nomadsim.acl import Acl
from nomadsim.clock import SimTime
from nomadsim.driver import Driver, ExecRefused, Execution
from nomadsim.errors import NomadError
from nomadsim.gojson import quote
from nomadsim.records import Alloc, Eval, JsonDict
from nomadsim.scheduler import Scheduler
from nomadsim.state import StateStore, stamp_eval


def alloc_job_eval(eval_id: str, alloc: Alloc, triggered_by: str) -> Eval:
    """An evaluation of the allocation's job, as Nomad creates one for a drain,
    an allocation stop or a node that went down."""
    return Eval(
        id=eval_id,
        namespace=alloc.namespace,
        priority=int(alloc.job.get("Priority", 50)),
        type=alloc.job_type,
        triggered_by=triggered_by,
        job_id=alloc.job_id,
        job_modify_index=int(alloc.job.get("ModifyIndex", 0)),
    )


class AllocEndpoint:
    def __init__(
        self,
        store: StateStore,
        time: SimTime,
        new_id: Callable[[], str],
        scheduler: Scheduler,
        driver: Driver,
        acl: Acl,
    ) -> None:
        self._store = store
        self._time = time
        self._new_id = new_id
        self._scheduler = scheduler
        self._driver = driver
        self._acl = acl

    def migrate(self, allocs: list[Alloc], triggered_by: str) -> list[Eval]:
        """Set DesiredTransition.Migrate and evaluate each job once."""
        store = self._store
        evals: dict[tuple[str, str], Eval] = {}
        with store.txn("AllocUpdateDesiredTransition") as tx:
            for a in allocs:
                tx.put_alloc(
                    replace(a, migrate=True, modify_index=tx.index, modify_time=self._time.now_ns())
                )
                key = (a.namespace, a.job_id)
                if key not in evals:
                    rec = store.job(*key)
                    ev = alloc_job_eval(self._new_id(), a, triggered_by)
                    if rec is not None:
                        ev = replace(ev, job_modify_index=rec.spec["ModifyIndex"])
                    evals[key] = ev
                    tx.put_eval(stamp_eval(ev, tx.index, self._time.now_ns()))
        for ev in evals.values():
            self._scheduler.enqueue(ev.id)
        return [store.evals[e.id] for e in evals.values()]

    def stop(self, alloc_id: str) -> JsonDict:
        alloc = self._store.allocs.get(alloc_id)
        if alloc is None:
            raise NomadError(404, "allocation not found")
        (ev,) = self.migrate([alloc], "alloc-stop")
        return {"EvalID": ev.id, "Index": ev.create_index}

    def exec(
        self, alloc_id: str, task: str, command: list[str], tty: bool, token: str | None
    ) -> Execution:
        """Start a command in an allocation's task. The checks and texts of
        Nomad's server (nomad/client_alloc_endpoint.go exec), in its order,
        then its client's (driver.py). Errors without a code in Nomad,
        `Permission denied` among them, are 500 here as they are there."""
        acl = self._acl
        # Authenticate: a token that resolves to nothing is refused before the
        # allocation is looked up; no token at all is the anonymous token.
        if acl.enabled and token and not acl.known(token):
            raise NomadError(500, "Permission denied")  # structs.ErrPermissionDenied
        alloc = self._store.allocs.get(alloc_id)
        if alloc is None:
            # structs.NewErrUnknownAllocation: ErrUnknownAllocationPrefix + " %q"
            raise NomadError(404, f"Unknown allocation {quote(alloc_id)}")
        if not acl.allows(token, "alloc-exec"):
            raise NomadError(500, "Permission denied")
        if alloc.client_terminal():
            raise NomadError(
                400,
                f"exec not possible, client status of allocation {alloc.id} "
                f"is {alloc.client_status}",
            )
        node = self._store.nodes.get(alloc.node_id)
        if node is None:
            raise NomadError(400, f"Unknown node {quote(alloc.node_id)}")
        if node.status != "ready":
            # The server holds no connection to a node that stopped heartbeating.
            raise NomadError(404, "No path to node")  # structs.ErrNoNodeConn
        try:
            return self._driver.exec(alloc, task, command, tty, lambda cap: acl.allows(token, cap))
        except ExecRefused as exc:
            raise NomadError(exc.status, exc.text) from None
