"""The only package that talks to Nomad: the gateway interface the rest of the
controller depends on, its python-nomad implementation, the event-stream
reader, the variable lock and the runner job layout.

- `gateway`: the interface (`NomadGateway`) the rest depends on;
- `errors`: Nomad's errors, direct and forwarded, classified once; the retry policy;
- `connection`: where and how to reach Nomad, built once from the settings;
- `client`: its implementation on python-nomad, over `session`, a requests
  session whose plain requests skip the session layer; `aclient`: a claim's
  register on the API's event loop (no thread hop);
- `decode`: Nomad's JSON → the model; `wire`: the fields of its lists and
  event frames that are read, so the rest of those answers is skipped as parsed;
- `stream`, `events`: the event-stream reader and its frames as typed references;
- `exec`: the allocation exec client (WebSocket); `nodes`: where an exec goes
  first (the allocation's node's own agent); `budget`: connections per agent;
- `jobs`: the job layout; `template_file`: an operator's own template.
"""
