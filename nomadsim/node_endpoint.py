"""The server's node operations (Nomad's nomad/node_endpoint.go): register,
drain, eligibility, status (the simulator's /_sim node down and up) and
UpdateAlloc, through which a client reports on its allocations.

Capacity that appears (a node eligible or up again, an allocation that
stopped holding resources) gives the blocked evaluations another try, as
Nomad's blocked-evals tracker does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nomadsim.alloc_endpoint import alloc_job_eval
from nomadsim.clock import SimTime
from nomadsim.drainer import Drainer
from nomadsim.encode import go_time, node_events
from nomadsim.errors import NomadError, Origin
from nomadsim.ports import Ports
from nomadsim.records import FAILED, Alloc, Eval, JsonDict, Node
from nomadsim.scheduler import Scheduler
from nomadsim.state import StateStore, stamp_alloc, stamp_eval


class NodeEndpoint:
    def __init__(
        self,
        store: StateStore,
        time: SimTime,
        new_id: Callable[[], str],
        scheduler: Scheduler,
        drainer: Drainer,
        ports: Ports,
    ) -> None:
        self._store = store
        self._time = time
        self._new_id = new_id
        self._scheduler = scheduler
        self._drainer = drainer
        self._ports = ports

    def register(
        self,
        name: str,
        http_addr: str,
        cpu_mhz: int,
        memory_mb: int,
        ip: str = "",
        disk_mb: int = 4_194_304,
    ) -> None:
        """A client node joins the cluster, ready and eligible."""
        now = self._time.now_ns()
        with self._store.txn("NodeRegister") as tx:
            node = Node(
                id=self._new_id(),
                secret_id=self._new_id(),
                name=name,
                datacenter="dc1",
                http_addr=http_addr,
                ip=ip,
                cpu_mhz=cpu_mhz,
                memory_mb=memory_mb,
                disk_mb=disk_mb,
                status_updated_at=now // 1_000_000_000,
                events=(
                    {
                        "Message": "Node registered",
                        "Subsystem": "Cluster",
                        "Details": None,
                        "Timestamp": go_time(now),
                        "CreateIndex": 0,
                    },
                ),
                create_index=tx.index,
                modify_index=tx.index,
            )
            tx.put_node(node)

    def get(self, node_id: str) -> Node:
        node = self._store.nodes.get(node_id)
        if node is None:
            raise NomadError(404, "node not found")
        return node

    def drain(self, node_id: str, spec: Any, mark_eligible: bool) -> JsonDict:
        node = self.get(node_id)
        if spec is None:
            deadline = None
            ignore = False
        else:
            if not isinstance(spec, dict):
                raise NomadError(400, "DrainSpec must be an object or null")
            deadline = spec.get("Deadline", 0)
            if isinstance(deadline, bool) or not isinstance(deadline, int):
                raise NomadError(400, "DrainSpec.Deadline must be an integer of nanoseconds")
            ignore = bool(spec.get("IgnoreSystemJobs", False))
        new = self._drainer.set_drain(node, deadline, ignore, mark_eligible)
        if deadline is None and new.eligibility == "eligible":
            self._scheduler.unblock_all()
        return _node_update_response(new.modify_index)

    def set_eligibility(self, node_id: str, eligibility: Any) -> JsonDict:
        node = self.get(node_id)
        if eligibility not in ("eligible", "ineligible"):
            raise NomadError(400, f'invalid scheduling eligibility "{eligibility}"')
        if eligibility == "eligible" and node.drain is not None:
            raise NomadError(
                500,
                "can not set node's scheduling eligibility to eligible while it is draining",
                origin=Origin.PLAIN,
            )
        with self._store.txn("NodeUpdateEligibility") as tx:
            message = f"Node marked as {eligibility}"
            events = node_events(node, message, "Cluster", tx.index, self._time.now_ns())
            tx.put_node(
                replace(node, eligibility=eligibility, modify_index=tx.index, events=events)
            )
        if eligibility == "eligible":
            self._scheduler.unblock_all()
        return _node_update_response(tx.index)

    def set_status(self, node_id: str, status: str) -> None:
        """The node stops heartbeating (`down`: its allocations are lost and
        their jobs evaluated) or comes back (`ready`)."""
        node = self.get(node_id)
        if node.status == status:
            return
        message = "Node heartbeat missed" if status == "down" else "Node reregistered by heartbeat"
        store = self._store
        with store.txn("NodeUpdateStatus") as tx:
            tx.put_node(
                replace(
                    node,
                    status=status,
                    modify_index=tx.index,
                    status_updated_at=self._time.now_ns() // 1_000_000_000,
                    events=node_events(node, message, "Cluster", tx.index, self._time.now_ns()),
                )
            )
        if status != "down":
            self._scheduler.unblock_all()
            return
        jobs: dict[tuple[str, str], Alloc] = {}
        for a in store.node_allocs(node_id):
            if not a.terminal():
                jobs.setdefault((a.namespace, a.job_id), a)
        if not jobs:
            return
        with store.txn("EvalUpdate") as tx:
            evals = []
            for a in jobs.values():
                ev = replace(
                    alloc_job_eval(self._new_id(), a, "node-update"),
                    node_id=node_id,
                    node_modify_index=tx.index - 1,
                )
                evals.append(ev)
                tx.put_eval(stamp_eval(ev, tx.index, self._time.now_ns()))
        for ev in evals:
            self._scheduler.enqueue(ev.id)

    def reregister(self, node_id: str) -> None:
        """The node's agent started again: it registers (`initializing`), then
        its first heartbeat makes it `ready` (client/client.go `registerNode`,
        `updateNodeStatus`). Neither status taints its allocations."""
        node = self.get(node_id)
        with self._store.txn("NodeRegister") as tx:
            tx.put_node(
                replace(
                    node,
                    status="initializing",
                    modify_index=tx.index,
                    status_updated_at=self._time.now_ns() // 1_000_000_000,
                )
            )
        self.set_status(node_id, "ready")

    def update_alloc(self, alloc: Alloc) -> Alloc:
        """A client's report on its allocation, committed as an
        AllocClientUpdate. A report of failure evaluates the job
        (`alloc-failure`: the reschedule policy decides what follows); the
        drainer looks at the allocation's node again; an allocation that is
        client-terminal frees its ports and maybe room for blocked evaluations."""
        evals: tuple[Eval, ...] = ()
        if alloc.client_status == FAILED:
            failed = Eval(
                id=self._new_id(),
                namespace=alloc.namespace,
                priority=int(alloc.job.get("Priority", 50)),
                type=alloc.job_type,
                triggered_by="alloc-failure",
                job_id=alloc.job_id,
                job_modify_index=int(alloc.job.get("JobModifyIndex", 0)),
            )
            evals = (failed,)
        with self._store.txn("AllocClientUpdate") as tx:
            new = stamp_alloc(alloc, tx.index, self._time.now_ns(), client=True)
            tx.put_alloc(new)
            for ev in evals:
                tx.put_eval(stamp_eval(ev, tx.index, self._time.now_ns()))
        for ev in evals:
            self._scheduler.enqueue(ev.id)
        self._drainer.on_alloc_change(new)
        if new.client_terminal():
            self._ports.release(new)
            self._scheduler.unblock_all()
        return new


def _node_update_response(index: int) -> JsonDict:
    """NodeDrainUpdateResponse, which the eligibility endpoint answers too."""
    return {"NodeModifyIndex": index, "EvalIDs": None, "EvalCreateIndex": 0, "Index": index}
