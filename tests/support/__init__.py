"""Helpers shared by tests in several folders (and by bench/): import from
here, never from conftest.py or from another test module. Fixtures stay in
the conftest files and call into these modules:

- `fake_nomad`: the in-memory Nomad of the unit tests;
- `exec_fake`: the fake of Nomad's allocation exec (scripted sessions and
  the opener that records and refuses them) for the relay and file tests;
- `ports`, `processes`, `controller`: loopback ports, child processes, and
  controllers started in this process or as a child;
- `sim`: the simulator's test timings; `tls`: mutual TLS for stand-in servers;
- `api_client`: the API tests' OpenAPI-checked clients and request bodies;
- `balancer`: a round-robin TCP load balancer with health checks, in front
  of controller replicas;
- `one_runner`, `api_server`, `world`: a controller over the fake with one
  runner; the whole service on uvicorn; a learning platform's client of it.
"""
