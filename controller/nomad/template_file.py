"""An operator's own runner template (`NRC_TEMPLATE_JOB_FILE`), read once at
start-up, as Poseidon reads its `templatejobfile`.

The file is a Nomad job in HCL or in Nomad's API JSON (what `nomad job run
-output` or `nomad job inspect` print: `{"Job": {...}}`, or the job alone).
HCL is parsed by Nomad itself (`POST /v1/jobs/parse`), so the controller
carries no HCL parser and reads exactly the HCL the cluster's Nomad reads.
A template that cannot carry runners (unparsable, no `default-group` with a
Docker `default-task`) raises `TemplateFileError` with one line saying why;
`run` exits 2 with it, as for a bad setting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from controller.nomad.gateway import NomadAPIError, NomadUnavailable
from controller.nomad.jobs import JsonDict, base_template_problem


class TemplateFileError(Exception):
    """The template file cannot be used; `str()` is one line naming the file."""


class ParsesJobs(Protocol):
    def parse_job_hcl(self, hcl: str) -> JsonDict: ...


def _one_line(text: str) -> str:
    return " ".join(text.split())


def load_template_file(path: str, nomad: ParsesJobs) -> JsonDict:
    """The template job in the file, as Nomad's API JSON."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateFileError(f"{path}: cannot be read: {exc}") from None
    if text.lstrip()[:1] in ("{", "["):  # HCL never starts with a bracket
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise TemplateFileError(f"{path}: not valid JSON: {exc}") from None
        job = data.get("Job", data) if isinstance(data, dict) else None
    else:
        try:
            job = nomad.parse_job_hcl(text)
        except NomadAPIError as exc:
            raise TemplateFileError(
                f"{path}: Nomad cannot parse it: {_one_line(str(exc))}"
            ) from None
        except NomadUnavailable as exc:
            raise TemplateFileError(
                f"{path}: Nomad is needed to parse HCL and is unavailable: {_one_line(str(exc))}"
            ) from None
    if not isinstance(job, dict) or not isinstance(job.get("TaskGroups"), list):
        raise TemplateFileError(f"{path}: not a Nomad job (no TaskGroups)")
    problem = base_template_problem(job)
    if problem is not None:
        raise TemplateFileError(f"{path}: {problem}")
    return job
