# A runner template job with the field values Poseidon's production runs by
# default (its built-in template, used when no `templatejobfile` is set).
# Written for this repository from those values; the layout and comments are
# ours. Used to check that an adopted Poseidon template and an operator's own
# template file read back and register as Poseidon's would.

job "template-0" {
  type        = "batch"
  datacenters = ["dc1"]

  group "default-group" {
    count = 1

    # Even spread of a pool over the nodes.
    spread {
      attribute = "${node.unique.name}"
      weight    = 100
    }

    ephemeral_disk {
      size    = 10
      migrate = false
      sticky  = false
    }

    restart {
      mode     = "fail"
      attempts = 3
      interval = "1h"
      delay    = "15s"
    }

    reschedule {
      unlimited      = false
      attempts       = 3
      interval       = "6h"
      delay_function = "exponential"
      delay          = "1m"
      max_delay      = "4m"
    }

    task "default-task" {
      driver       = "docker"
      kill_signal  = "SIGKILL"
      kill_timeout = "0s"

      config {
        image        = "openhpi/docker_exec_phusion"
        command      = "sleep"
        args         = ["infinity"]
        network_mode = "none"
      }

      resources {
        cpu    = 40
        memory = 50
      }

      logs {
        max_files     = 1
        max_file_size = 1
      }
    }
  }

  # Never runs (count 0): its meta is where Poseidon keeps a job's own state,
  # so that changing it does not restart the runner task.
  group "config" {
    count = 0

    meta {
      used               = "false"
      prewarmingPoolSize = "0"
    }

    task "config" {
      driver = "exec"

      config {
        command = "true"
      }

      resources {
        cpu    = 1
        memory = 10
      }

      logs {
        max_files     = 1
        max_file_size = 1
      }
    }
  }
}
