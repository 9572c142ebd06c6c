"""observe, derive, plan, act: the reconcile loop and its work queue.

- `snapshot`, `specs`, `heard`, `reads`, `observe`: what the controller knows
  of Nomad, and how it reads it;
- `derive`, `plan` (pure), `expectations`, `act`, `writes`: from views to writes;
- `claims`: claim, release, touch; `waiting`: claims that wait for a runner;
  `uses`: a runner's uses as tokens, and their registry;
- `activity`: touches through any replica reach the leader that expires claims;
- `queue`, `worker`, `reconciler`, `ratelimit`: the loop's machinery;
- `prewarming`: adaptive pool sizes wired in;
- `leader`: leader election; `facade`: `Pools`, all the API uses;
  `loop`: the `Controller`, wiring and triggers.
"""
