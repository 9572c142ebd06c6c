"""The only package that talks to Nomad: the gateway interface the rest of the
controller depends on, its python-nomad implementation, the event-stream
reader, the variable lock and the runner job layout."""
