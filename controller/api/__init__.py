"""The HTTP API (Poseidon-compatible) over the controller; see `app.create_app`."""

from controller.api.app import create_app

__all__ = ["create_app"]
