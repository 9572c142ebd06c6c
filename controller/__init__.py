"""nomad-runner-controller: warm pools of sandbox runners on HashiCorp Nomad."""

__version__ = "0.1.0"
