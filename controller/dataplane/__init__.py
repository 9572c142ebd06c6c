"""What executions and file operations share about the runner a client
claimed:

- `answers`: pure; what a client is told when its runner cannot be used or
  Nomad's exec failed, and how hard to look for a loss first;
- `runners`: `ClaimedRunners`, the one adapter both ask: may the runner be
  used, begin a use of it, was it lost meanwhile (one settle schedule).
"""
