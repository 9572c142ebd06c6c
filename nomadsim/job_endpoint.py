"""The server's job operations (Nomad's nomad/job_endpoint.go): register,
deregister and evaluate.

Each writes the job and its evaluation in one transaction and hands the
evaluation to the scheduler, which runs it just after the request returns,
never inside it. Register checks `EnforceIndex` as Nomad does and skips the
job write for a spec that did not change (it still evaluates); deregister
stops the job (a new version with `Stop`) or, with purge, deletes it and its
allocations at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nomadsim.clock import SimTime
from nomadsim.encode import JobValidationError, canonicalize_job
from nomadsim.errors import NomadError, Origin
from nomadsim.ports import Ports
from nomadsim.records import Eval, JobRecord, JsonDict
from nomadsim.scheduler import Scheduler
from nomadsim.state import StateStore, stamp_eval

# Fields of a job that are not part of its spec (SpecChanged ignores them).
_NON_SPEC = frozenset(
    {
        "Status",
        "StatusDescription",
        "Stable",
        "Version",
        "SubmitTime",
        "CreateIndex",
        "ModifyIndex",
        "JobModifyIndex",
    }
)


class JobEndpoint:
    def __init__(
        self,
        store: StateStore,
        time: SimTime,
        new_id: Callable[[], str],
        scheduler: Scheduler,
        ports: Ports,
        memory_oversubscription: bool = True,
    ) -> None:
        self._store = store
        self._time = time
        self._new_id = new_id
        self._scheduler = scheduler
        self._ports = ports
        self._oversubscription = memory_oversubscription

    def register(self, raw: Any, namespace: str, enforce: bool, enforce_index: int) -> JsonDict:
        if not isinstance(raw, dict):
            raise NomadError(400, "Job must be specified")
        job_id = raw.get("ID")
        if not job_id or not isinstance(job_id, str):
            raise NomadError(400, "Job ID hasn't been provided")
        store = self._store
        existing = store.job(namespace, job_id)
        if enforce:
            if enforce_index == 0 and existing is not None:
                raise NomadError(
                    500, "Enforcing job modify index 0: job already exists", origin=Origin.PLAIN
                )
            if enforce_index != 0 and existing is None:
                raise NomadError(
                    500,
                    f"Enforcing job modify index {enforce_index}: job does not exist",
                    origin=Origin.PLAIN,
                )
            if existing is not None and existing.spec["JobModifyIndex"] != enforce_index:
                raise NomadError(
                    500,
                    f"Enforcing job modify index {enforce_index}: job exists with conflicting "
                    f"job modify index: {existing.spec['JobModifyIndex']}",
                    origin=Origin.PLAIN,
                )
        try:
            spec = canonicalize_job(raw, namespace)
        except JobValidationError as exc:
            raise NomadError(500, str(exc), origin=Origin.PLAIN) from None
        now = self._time.now_ns()
        periodic = (spec.get("Periodic") or {}).get("Enabled") or spec.get("ParameterizedJob")
        if existing is not None and not _spec_changed(existing.spec, spec):
            # Nomad skips the job write for an unchanged spec but still evaluates.
            ev = self._new_eval(existing.spec, "job-register")
            with store.txn("EvalUpdate") as tx:
                ev = replace(ev, job_modify_index=existing.spec["JobModifyIndex"])
                tx.put_eval(stamp_eval(ev, tx.index, self._time.now_ns()))
            self._scheduler.enqueue(ev.id)
            return _register_response(
                ev.id, tx.index, existing.spec["JobModifyIndex"], tx.index, self._warnings(spec)
            )
        eval_id = ""
        with store.txn("JobRegister") as tx:
            spec["Version"] = existing.spec["Version"] + 1 if existing else 0
            spec["CreateIndex"] = existing.spec["CreateIndex"] if existing else tx.index
            spec["ModifyIndex"] = tx.index
            spec["JobModifyIndex"] = tx.index
            spec["SubmitTime"] = now
            spec["Status"] = existing.spec["Status"] if existing else "pending"
            versions = (*existing.versions, spec) if existing else (spec,)
            tx.put_job(JobRecord(namespace, job_id, spec, versions))
            if existing is None:
                store.jobs_ever_registered += 1
            if not periodic:
                ev = replace(self._new_eval(spec, "job-register"), job_modify_index=tx.index)
                eval_id = ev.id
                tx.put_eval(stamp_eval(ev, tx.index, self._time.now_ns()))
        if eval_id:
            self._scheduler.enqueue(eval_id)
        return _register_response(
            eval_id, tx.index if eval_id else 0, tx.index, tx.index, self._warnings(spec)
        )

    def _warnings(self, spec: JsonDict) -> str:
        """Nomad's register warnings: a memory_max without oversubscription."""
        if self._oversubscription:
            return ""
        warnings = [
            f'Memory oversubscription is not enabled; Task "{group["Name"]}.{task["Name"]}" '
            "memory_max value will be ignored. Update the Scheduler Configuration to allow "
            "oversubscription."
            for group in spec.get("TaskGroups") or []
            for task in group.get("Tasks") or []
            if (task.get("Resources") or {}).get("MemoryMaxMB")
        ]
        if not warnings:
            return ""
        return f"{len(warnings)} warning(s):\n" + "".join(f"\n* {w}" for w in warnings)

    def _new_eval(self, spec: JsonDict, triggered_by: str, eval_type: str = "") -> Eval:
        return Eval(
            id=self._new_id(),
            namespace=spec["Namespace"],
            priority=int(spec.get("Priority") or 50),
            type=eval_type or spec["Type"],
            triggered_by=triggered_by,
            job_id=spec["ID"],
        )

    def deregister(self, namespace: str, job_id: str, purge: bool) -> JsonDict:
        store = self._store
        rec = store.job(namespace, job_id)
        if rec is None:
            return _deregister_response("", 0, 0, 0)
        # Nomad's deregistration evaluation is always of type service.
        ev = self._new_eval(rec.spec, "job-deregister", eval_type="service")
        with store.txn("JobDeregister") as tx:
            ev = replace(ev, job_modify_index=tx.index)
            if purge:
                for alloc in store.job_allocs(namespace, job_id):
                    self._ports.release(alloc)
                    tx.delete_alloc(alloc.id)
                tx.delete_job(namespace, job_id)
                modify_index = rec.spec["JobModifyIndex"]
            else:
                spec = dict(rec.spec)
                spec.update(
                    Stop=True,
                    Version=spec["Version"] + 1,
                    ModifyIndex=tx.index,
                    JobModifyIndex=tx.index,
                    SubmitTime=self._time.now_ns(),
                )
                tx.put_job(replace(rec, spec=spec, versions=(*rec.versions, spec)))
                modify_index = tx.index
            tx.put_eval(stamp_eval(ev, tx.index, self._time.now_ns()))
        self._scheduler.enqueue(ev.id)
        if purge:
            self._scheduler.unblock_all()
        return _deregister_response(ev.id, tx.index, modify_index, tx.index)

    def evaluate(self, namespace: str, job_id: str) -> JsonDict:
        rec = self._store.job(namespace, job_id)
        if rec is None:
            # Job.Evaluate's error has no code: forwarded, it is wrapped
            # (directly, Nomad answers it 500; the simulator keeps its 404).
            raise NomadError(404, "job not found", origin=Origin.PLAIN)
        ev = self._new_eval(rec.spec, "job-register")
        with self._store.txn("EvalUpdate") as tx:
            ev = replace(ev, job_modify_index=rec.spec["ModifyIndex"])
            tx.put_eval(stamp_eval(ev, tx.index, self._time.now_ns()))
        self._scheduler.enqueue(ev.id)
        return {
            "EvalID": ev.id,
            "EvalCreateIndex": tx.index,
            "JobModifyIndex": rec.spec["JobModifyIndex"],
            "Warnings": "",
            "Index": tx.index,
            "LastContact": 0,
            "KnownLeader": False,
            "NextToken": "",
        }


def _spec_changed(old: JsonDict, new: JsonDict) -> bool:
    return any(old.get(k) != new.get(k) for k in new if k not in _NON_SPEC)


def _register_response(
    eval_id: str, eval_index: int, job_modify_index: int, index: int, warnings: str = ""
) -> JsonDict:
    return {
        "EvalID": eval_id,
        "EvalCreateIndex": eval_index,
        "JobModifyIndex": job_modify_index,
        "Warnings": warnings,
        "Index": index,
        "LastContact": 0,
        "KnownLeader": False,
        "NextToken": "",
    }


def _deregister_response(
    eval_id: str, eval_index: int, job_modify_index: int, index: int
) -> JsonDict:
    return {
        "EvalID": eval_id,
        "EvalCreateIndex": eval_index,
        "JobModifyIndex": job_modify_index,
        "VolumeEvalID": "",
        "VolumeEvalIndex": 0,
        "Index": index,
        "LastContact": 0,
        "KnownLeader": False,
        "NextToken": "",
    }
