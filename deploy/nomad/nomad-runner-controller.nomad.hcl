# nomad-runner-controller as a Nomad service job: two replicas, one leader.
#
#   nomad namespace apply -description "sandbox runners" runners
#   nomad job run -var image=registry.example/nomad-runner-controller:0.1.0 \
#       deploy/nomad/nomad-runner-controller.nomad.hcl
#   nomad acl policy apply -namespace default -job nomad-runner-controller \
#       nomad-runner-controller deploy/nomad/acl-policy.hcl
#
# The controller itself runs in the `default` namespace; the runners it keeps
# (template-E and E-<uuid> jobs) live in var.runner_namespace. With ACLs on,
# the task talks to Nomad with its workload identity: the policy applied above
# is attached to this job, so no token has to be created, stored or rotated.
# (To use a token of your own instead, see docs/operations.md.) The API token
# clients send comes from the job's own Nomad variable (below).
#
# Both replicas serve the whole API; only the leader keeps the pools up, and
# the other takes that over within about twice NRC_LEADER_TTL when the leader
# dies (at once when the leader stops cleanly and releases the lock). Put a
# load balancer that checks /readyz in front: see "High availability" in the
# README.

variable "image" {
  type        = string
  description = "The controller image (built from this repository's Dockerfile), with its tag."
}

variable "runner_namespace" {
  type        = string
  description = "Namespace of the template and runner jobs: Poseidon's namespace when migrating. Keep it equal to the namespace in acl-policy.hcl."
  default     = "runners"
}

variable "datacenters" {
  type    = list(string)
  default = ["*"]
}

job "nomad-runner-controller" {
  namespace   = "default"
  type        = "service"
  datacenters = var.datacenters

  group "controller" {
    # Two replicas with leader election: one reconciles, one stands by.
    count = 2

    # Never both replicas on one node: losing that node would lose both.
    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    network {
      port "http" {
        to = 7200
      }
    }

    update {
      max_parallel     = 1
      health_check     = "checks"
      min_healthy_time = "10s"
      healthy_deadline = "3m"
      auto_revert      = true
    }

    service {
      name     = "nomad-runner-controller"
      provider = "nomad"
      port     = "http"
      # On a stop, Nomad deregisters the service first and waits this long
      # before the SIGTERM: clients that discover the controller through it
      # stop sending here while it still serves everything.
      shutdown_delay = "5s"
      # deploy/prometheus/prometheus.yml keeps the instances tagged "prometheus".
      tags = ["prometheus", "metrics_path=/metrics"]

      # Liveness: the process answers. A replica that stops answering is
      # restarted.
      check {
        name     = "alive"
        type     = "http"
        path     = "/healthz"
        interval = "10s"
        timeout  = "2s"

        check_restart {
          limit = 3
          grace = "30s"
        }
      }

      # Readiness: every replica that has observed Nomad serves and passes
      # (a draining one fails at once). With the update block's
      # health_check = "checks", a deployment moves on to the next replica
      # only once the new one serves; a load balancer checks the same path.
      check {
        name     = "ready"
        type     = "http"
        path     = "/readyz"
        interval = "5s"
        timeout  = "2s"
      }
    }

    task "controller" {
      driver = "docker"

      config {
        image = var.image
        ports = ["http"]
      }

      # The task's workload identity as NOMAD_TOKEN. With ACLs off Nomad
      # ignores it.
      identity {
        env = true
      }

      # Only variables the controller reads (see `nomad-runner-controller config`
      # and the README's configuration table). NRC_API_HOST=0.0.0.0 and
      # NRC_LOG_FORMAT=json come with the image.
      env {
        # The Nomad agent on the node the task runs on. With TLS, use https://
        # and set NOMAD_CACERT (and NOMAD_CLIENT_CERT/NOMAD_CLIENT_KEY for mTLS)
        # to files placed in the task's secrets/ directory.
        NOMAD_ADDR      = "http://${attr.unique.network.ip-address}:4646"
        NOMAD_NAMESPACE = var.runner_namespace
        NRC_API_PORT    = "7200"
        # Where the other replica reaches this one's API: a websocketUrl one
        # replica answers then works whichever replica the client's WebSocket
        # reaches (the execution is taken from its issuer; the ids are signed
        # with a key derived from NRC_API_TOKEN, or NRC_REPLICA_SECRET).
        NRC_API_ADVERTISE_URL = "http://${NOMAD_ADDR_http}"

        NRC_LEADER_ELECTION  = "true"
        NRC_LEADER_LOCK_PATH = "nomad-runner-controller/leader"
        NRC_LEADER_TTL       = "15s"

        NRC_LOG_LEVEL = "INFO"

        # SIGTERM drains (docs/operations.md): running executions get this
        # long to end by themselves. shutdown_delay + this + 10 s (the last
        # frames, then the API and the loop stop) must stay under kill_timeout.
        NRC_SHUTDOWN_GRACE = "15s"
      }

      # The token API clients must send (Poseidon-Token or Authorization:
      # Bearer), from this job's own Nomad variable, which its workload identity
      # may read without any policy. Create it before the first run:
      #   nomad var put -namespace default nomad/jobs/nomad-runner-controller \
      #       api_token="$(openssl rand -hex 32)"
      # Without it the task gets no NRC_API_TOKEN and the controller refuses
      # to start (it would listen on 0.0.0.0 without authentication): the
      # task fails rather than serve open. Changing it restarts the task.
      template {
        destination = "secrets/api.env"
        env         = true
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/nomad-runner-controller" }}NRC_API_TOKEN={{ .api_token }}{{ end }}
        EOT
      }

      # SIGTERM starts the drain: /readyz turns 503, new claims, executions and
      # file operations answer 503 SHUTTING_DOWN (clients retry elsewhere),
      # the leader lock is released at once (the other replica leads within
      # about a second), running executions get NRC_SHUTDOWN_GRACE and are
      # then ended with an error frame; the process exits 0. 30 s is Nomad's
      # default client max_kill_timeout: a longer grace needs both raised.
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      resources {
        cpu    = 300
        memory = 256
      }
    }
  }
}
