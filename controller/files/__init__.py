"""Files in a runner (Poseidon's `/files` routes): copy and delete, list,
download. Every operation is one Nomad exec on the allocation the runner was
claimed on; the pure parts (paths, the upload's manifest, the tar stream, the
commands, the listing's records, byte ranges) are tested without Nomad.

- `paths`, `upload`, `tar`, `scripts`, `listing`, `ranges`: the pure parts;
- `errors`: how an operation fails;
- `service`: the three operations as Nomad execs.
"""
