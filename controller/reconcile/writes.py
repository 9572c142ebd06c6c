"""writes: how a spec we write reaches the snapshot — register it with Nomad,
stamp it with the JobModifyIndex Nomad answered (the version any later
register with EnforceIndex compares against), and show it to the next
reader at once, before any list does.

A claim, the end of a claim and a new template all write this way; the
next writer after us (a claimer, a pass) then starts from what we wrote,
never from the older spec a list still shows.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from controller.nomad import jobs
from controller.nomad.gateway import WriteResult

JsonDict = dict[str, Any]

log = logging.getLogger(__name__)


class Registers(Protocol):
    def register_job(self, job: JsonDict, enforce_index: int | None = None) -> WriteResult: ...


class RegistersAsync(Protocol):
    async def register_job(
        self, job: JsonDict, enforce_index: int | None = None
    ) -> WriteResult: ...


class ShowsWrites(Protocol):
    def apply_spec(self, job_id: str, spec: JsonDict) -> None: ...


class SpecWriter:
    """`async_gateway`: the same register on the event loop (a claim's; see
    `controller.nomad.aclient`); without it `register_async` runs `register`
    on a thread."""

    def __init__(
        self,
        *,
        gateway: Registers,
        observer: ShowsWrites,
        async_gateway: RegistersAsync | None = None,
    ) -> None:
        self._gateway = gateway
        self._observer = observer
        self._async_gateway = async_gateway

    def register(self, spec: JsonDict, *, enforce_index: int | None = None) -> JsonDict:
        """Write `spec` (only over version `enforce_index`, when given; 0: only
        if the job does not exist). Returns the spec as Nomad now holds it.
        Raises IndexConflict, NomadUnavailable and NomadAPIError as the
        gateway does, and then nothing is shown."""
        return self._shown(spec, self._gateway.register_job(spec, enforce_index=enforce_index))

    async def register_async(self, spec: JsonDict, *, enforce_index: int | None = None) -> JsonDict:
        """`register` without blocking the event loop."""
        if self._async_gateway is None:
            return await asyncio.to_thread(self.register, spec, enforce_index=enforce_index)
        result = await self._async_gateway.register_job(spec, enforce_index=enforce_index)
        return self._shown(spec, result)

    def _shown(self, spec: JsonDict, result: WriteResult) -> JsonDict:
        if result.warnings and jobs.template_env_id(jobs.job_id(spec)) is not None:
            # Once per template write, not per runner: an operator must see
            # e.g. that without memory oversubscription every runner is held
            # to its 50 MB reservation.
            for warning in result.warnings:
                log.warning("Nomad warns about %s: %s", jobs.job_id(spec), warning)
        written = jobs.with_modify_index(spec, result.job_modify_index)
        self._observer.apply_spec(jobs.job_id(written), written)
        return written
