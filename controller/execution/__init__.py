"""The execution half of the data plane: a client's command run in its
claimed runner through Nomad's allocation exec, relayed as Poseidon's
WebSocket frames.

- `command`: the client's request → the argv Nomad executes (pure);
- `frames`: Nomad's exec events → Poseidon's frames (pure);
- `store`: one-shot execution ids between `POST /execute` and the connect;
- `ids`: ids that name the replica that issued them, signed with the replicas' key (pure);
- `relay`: one execution, from the connect to the terminal frame;
- `outbox`: the frames waiting for a client, bounded by the output they hold;
- `service`: the parts one API needs, wired together.
"""
