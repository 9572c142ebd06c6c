"""The one error type of the simulator's server side."""

from __future__ import annotations

from typing import Any


class NomadError(Exception):
    """An error answered the way Nomad answers it: status code and plain text."""

    def __init__(self, status: int, text: str, body: Any = None) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
        self.body = body
