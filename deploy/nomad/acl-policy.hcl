# The least privilege nomad-runner-controller needs, for its workload identity
# (attached to the job, see nomad-runner-controller.nomad.hcl):
#
#   nomad acl policy apply -namespace default -job nomad-runner-controller \
#       nomad-runner-controller deploy/nomad/acl-policy.hcl
#
# or for a token of its own:
#
#   nomad acl policy apply nomad-runner-controller deploy/nomad/acl-policy.hcl
#   nomad acl token create -name nomad-runner-controller -policy nomad-runner-controller
#
# "runners" is the namespace of the template and runner jobs (NOMAD_NAMESPACE,
# the job file's var.runner_namespace): rename it here when yours differs.

namespace "runners" {
  # list-jobs: the job and allocation lists each pass observes.
  # read-job:  job specs, allocations, and the Job/Allocation/Evaluation
  #            topics of the event stream.
  # submit-job: register template and runner jobs, write claims into their
  #            meta (a register with EnforceIndex), deregister (stop and
  #            purge) runners.
  # alloc-exec: executions (/execute, /websocket) run commands in claimed
  #            runners through Nomad's allocation exec. Runners on a driver
  #            without file-system isolation (raw_exec) also need
  #            alloc-node-exec; Poseidon's docker runners do not.
  capabilities = ["list-jobs", "read-job", "submit-job", "alloc-exec"]

  # Leader election: the lock on NRC_LEADER_LOCK_PATH. Acquiring creates the
  # variable; renewing and releasing write it.
  variables {
    path "nomad-runner-controller/leader" {
      capabilities = ["read", "write"]
    }
    # With leader election: each replica publishes the runners touched
    # through it under the lock's path; the leader lists and reads them all,
    # and deletes what a stopped or crashed replica left (docs/inactivity.md).
    path "nomad-runner-controller/leader/activity/*" {
      capabilities = ["list", "read", "write", "destroy"]
    }
    # Adaptive prewarming (NRC_PREWARM_POLICY=adaptive): one variable per
    # environment holds its claim history across restarts.
    path "nomad-runner-controller/prewarm/*" {
      capabilities = ["read", "write"]
    }
  }
}

# The Node topic of the event stream: a node going down or draining makes the
# controller look at every pool at once instead of at the next resync.
node {
  policy = "read"
}
