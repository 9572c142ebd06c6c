"""NRC_TEMPLATE_JOB_FILE: an operator's template in HCL (parsed by Nomad) or
JSON, refused with one line when it cannot carry runners."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.nomad.gateway import NomadAPIError, NomadUnavailable
from controller.nomad.jobs import JsonDict
from controller.nomad.template_file import TemplateFileError, load_template_file

JOB: JsonDict = {
    "ID": "runner",
    "TaskGroups": [
        {"Name": "default-group", "Tasks": [{"Name": "default-task", "Driver": "docker"}]}
    ],
}


class Parser:
    """Nomad's /v1/jobs/parse: answers `job`, or raises `error`."""

    def __init__(self, job: JsonDict | None = None, error: Exception | None = None) -> None:
        self.job, self.error = job, error
        self.seen: list[str] = []

    def parse_job_hcl(self, hcl: str) -> JsonDict:
        self.seen.append(hcl)
        if self.error is not None:
            raise self.error
        assert self.job is not None
        return self.job


def test_json_is_read_without_nomad(tmp_path: Path) -> None:
    parser = Parser(error=AssertionError("not asked"))
    bare, wrapped = tmp_path / "bare.json", tmp_path / "wrapped.json"
    bare.write_text(json.dumps(JOB))
    wrapped.write_text(json.dumps({"Job": JOB}))  # as `nomad job inspect` prints it
    assert load_template_file(str(bare), parser) == JOB
    assert load_template_file(str(wrapped), parser) == JOB
    assert parser.seen == []


def test_hcl_is_parsed_by_nomad(tmp_path: Path) -> None:
    path = tmp_path / "runner.hcl"
    path.write_text('job "runner" {}\n')
    parser = Parser(job=JOB)
    assert load_template_file(str(path), parser) == JOB
    assert parser.seen == ['job "runner" {}\n']


CASES = [
    ("missing", None, None, "cannot be read"),
    ("broken.json", "{", None, "not valid JSON"),
    ("list.json", "[]", None, "not a Nomad job (no TaskGroups)"),
    (
        "unparsable.hcl",
        "job {",
        NomadAPIError(400, "runner.hcl:1,5-6: Missing name for job; All job blocks\nneed a name"),
        "Nomad cannot parse it: ",
    ),
    ("offline.hcl", "job {}", NomadUnavailable("parse_job: refused"), "Nomad is needed"),
    (
        "no-task.json",
        json.dumps({"TaskGroups": [{"Name": "default-group", "Tasks": []}]}),
        None,
        "no task 'default-task' in group 'default-group'",
    ),
    (
        "exec.json",
        json.dumps(
            {
                "TaskGroups": [
                    {"Name": "default-group", "Tasks": [{"Name": "default-task", "Driver": "exec"}]}
                ]
            }
        ),
        None,
        "task 'default-task' uses driver 'exec', not 'docker'",
    ),
]


@pytest.mark.parametrize(("name", "text", "error", "says"), CASES, ids=[c[0] for c in CASES])
def test_a_template_that_cannot_work_is_one_line_naming_the_file(
    tmp_path: Path, name: str, text: str | None, error: Exception | None, says: str
) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(TemplateFileError) as caught:
        load_template_file(str(path), Parser(job=None, error=error))
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and says in message
    assert "\n" not in message
