"""The only package that talks to Nomad: the gateway interface the rest of the
controller depends on, its python-nomad implementation, the event-stream
reader, the variable lock and the runner job layout.

- `gateway`: the interface (`NomadGateway`) the rest depends on;
- `client`: its implementation on python-nomad;
- `decode`: Nomad's JSON → the model;
- `stream`, `events`: the event-stream reader and its frames as typed references;
- `exec`: the allocation exec client (WebSocket);
- `jobs`: the job layout; `template_file`: an operator's own template.
"""
