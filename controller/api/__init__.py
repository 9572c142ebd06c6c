"""The HTTP API (Poseidon-compatible) over the controller; see `app.create_app`.

- `app`: `create_app`, the routes, error handlers and middleware;
- `auth`: the token, compared in constant time;
- `body`: request bodies (size and depth limits, JSON validated by us);
- `models`: the JSON bodies with Poseidon's field names;
- `errors`: every error answer in one shape;
- `runners`, `environments`, `executions`, `files`, `health`: the routes;
- `file_params`: the file routes' parameters, read as Poseidon reads them;
- `streamed`: responses streamed as produced, cut off when the body breaks;
- `openapi`: `/openapi.json` as the API answers;
- `drain`: the graceful drain on SIGTERM (new work refused, the rest ends);
- `guard`: browser defences (trusted Host, JSON content type, WebSocket Origin);
- `uploads`: bounds on uploads; `head_deadline`: a deadline on request heads;
- `replicas`: another replica's execution id, taken from the replica that issued it.
"""

from controller.api.app import create_app

__all__ = ["create_app"]
