"""The `nomad-runner-controller` command line (also `python -m controller`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any


def _bounded(
    cast: Callable[[str], float], what: str, low: float, high: float | None = None
) -> Callable[[str], Any]:
    """An argparse type: `cast` the text and keep it within [low, high]."""

    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < low:
            message = "must not be negative" if low == 0 else f"must be at least {low}"
            raise argparse.ArgumentTypeError(f"{message}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


_positive_int = _bounded(int, "an integer", 1)
_count = _bounded(int, "an integer", 0)
_seconds = _bounded(float, "seconds as a number", 0)
_port = _bounded(int, "a port number", 0, 65535)


def _migration_ordering(text: str) -> str:
    """An argparse type: one of the simulator's migration orderings. The
    simulator is imported here, when `sim` is parsed, so that `run` never
    loads it."""
    from nomadsim import ORDERINGS

    if text not in ORDERINGS:
        choices = ", ".join(repr(o) for o in ORDERINGS)
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {choices})")
    return text


def _api_url(text: str) -> str:
    """An argparse type: the API's base URL, ending in /api/v1."""
    from controller.smoke import UsageError, api_base

    try:
        return api_base(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _readable_file(text: str) -> str:
    """An argparse type: a file that can be read."""
    try:
        with open(text, "rb"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc.strerror or exc}") from None
    return text


def _rpc_limit(text: str) -> int:
    """An argparse type: rpc_max_conns_per_client as Nomad accepts it (0, or
    more than 25)."""
    value: int = _count(text)
    if 0 < value <= 25:
        raise argparse.ArgumentTypeError(f"must be 0 or more than 25 (as Nomad's), got {value}")
    return value


def _topology_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulated cluster's shape and limits (`sim` and `dev`)."""
    parser.add_argument(
        "--servers",
        type=_positive_int,
        default=3,
        help="Nomad servers; the first is the leader (default 3)",
    )
    parser.add_argument(
        "--entry",
        choices=("client", "leader", "follower"),
        default="client",
        help="the agent whose address is NOMAD_ADDR: a node's client agent (default), "
        "the leader, or a follower",
    )
    parser.add_argument(
        "--http-max-conns-per-client",
        type=_count,
        default=100,
        metavar="N",
        help="concurrent HTTP connections per client IP on each agent, beyond which Nomad "
        "answers 429 (default 100, as Nomad's; 0 = unlimited)",
    )
    parser.add_argument(
        "--rpc-max-conns-per-client",
        type=_rpc_limit,
        default=100,
        metavar="N",
        help="RPC connections per agent IP on each server; streaming ones (execs on other "
        "nodes, event streams through an agent) get N-20 (default 100, as Nomad's; "
        "0 = unlimited)",
    )


def _topology(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "servers": args.servers,
        "entry": args.entry,
        "http_max_conns_per_client": args.http_max_conns_per_client,
        "rpc_max_conns_per_client": args.rpc_max_conns_per_client,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nomad-runner-controller",
        description="Warm pools of sandbox runners on HashiCorp Nomad.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sim = commands.add_parser(
        "sim",
        help="serve a simulated Nomad cluster on Nomad's HTTP API",
        description="Serve Nomad's HTTP API (/v1) from an in-process simulator "
        "until SIGINT or SIGTERM. Fault injection lives under /_sim.",
    )
    sim.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sim.add_argument("--port", type=_port, default=4646, help="port to listen on (default 4646)")
    sim.add_argument("--nodes", type=_positive_int, default=3, help="client nodes (default 3)")
    sim.add_argument("--seed", type=int, default=0, help="seed for IDs and placement (default 0)")
    sim.add_argument(
        "--startup-delay",
        type=_seconds,
        default=0.5,
        metavar="SECONDS",
        help="time from placement to a running task (default 0.5)",
    )
    sim.add_argument(
        "--stop-delay",
        type=_seconds,
        default=0.2,
        metavar="SECONDS",
        help="time from a kill to a complete allocation (default 0.2)",
    )
    sim.add_argument(
        "--heartbeat-interval",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="event stream heartbeat interval (default 30)",
    )
    sim.add_argument(
        "--migration-ordering",
        type=_migration_ordering,
        default="production",
        metavar="{production,client,random}",
        help="event order of a migration: as observed in production (default), Nomad's "
        "client code path, or random per migration",
    )
    sim.add_argument(
        "--memory-oversubscription",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Nomad's memory_oversubscription_enabled: tasks may use up to their "
        "memory_max (default on, as on Poseidon's clusters)",
    )
    sim.add_argument(
        "--acl-token",
        default=None,
        metavar="TOKEN",
        help="require this X-Nomad-Token on every /v1 request (403 otherwise)",
    )
    sim.add_argument(
        "--gc-freeze-interval",
        type=_seconds,
        default=1.0,
        metavar="SECONDS",
        help="collect and freeze Python's heap this often, so that no full garbage "
        "collection stops the simulator for long: Nomad's Go runtime pauses for well under "
        "a millisecond (default 1; 0 leaves Python's collector as it is)",
    )
    _topology_arguments(sim)
    sim.add_argument(
        "--no-docker-stdin-close-on-exit",
        dest="docker_stdin_close_on_exit",
        action="store_false",
        help="keep an exec's stdin open after its output ended (Nomad >= 1.9); by default, "
        "as Nomad <= 1.8 with Docker, input sent then ends the exec without its exit frame",
    )
    commands.add_parser(
        "run",
        help="run the controller against the Nomad named by NOMAD_ADDR",
        description="Keep the runner pools of the Nomad cluster named by NOMAD_ADDR and "
        "serve the API on NRC_API_HOST:NRC_API_PORT until SIGINT or SIGTERM. Every setting "
        "is an environment variable: see `nomad-runner-controller config`.",
    )
    dev = commands.add_parser(
        "dev",
        help="the simulator, the controller against it and a demo environment, in one process",
        description="Start a simulated Nomad in this process, the controller against it and "
        "one demo environment (pool 5); print the URLs, the token, the smoke command for "
        "this instance and curl lines to try it. Ctrl-C stops.",
    )
    _topology_arguments(dev)
    smoke = commands.add_parser(
        "smoke",
        help="take one runner through claim, files, an execution and release against an API",
        description="Against a running API (this controller's or Poseidon's), as CodeOcean "
        "uses it: pick an environment with a pool, claim a runner, copy a file into it, run a "
        "command over the execution WebSocket (stdin, stdout, stderr, exit code), list and "
        "download the file, release the runner. One line per step with its answer and latency; "
        "the runner is released even after a failed step. Exit 0 when every step passed, 1 "
        "when one failed, 2 for bad arguments.",
    )
    smoke.add_argument(
        "--url",
        required=True,
        type=_api_url,
        help="the API's base URL as CodeOcean configures it, e.g. http://127.0.0.1:7200/api/v1 "
        "(the /api/v1 suffix may be left out)",
    )
    smoke.add_argument(
        "--token",
        default=None,
        help="the API token, sent as Poseidon-Token (default: $NRC_API_TOKEN; "
        "--token=TOKEN for one that begins with -)",
    )
    smoke.add_argument(
        "--environment",
        type=_count,
        default=None,
        metavar="ID",
        help="the execution environment to claim from (default: the first listed with "
        "prewarmingPoolSize > 0)",
    )
    smoke.add_argument(
        "--ca-file",
        type=_readable_file,
        default=None,
        metavar="FILE",
        help="the CA certificates (PEM) that an https:// API and its wss:// WebSocket are "
        "verified against, like CodeOcean's ca_file (default: the system's)",
    )
    config = commands.add_parser(
        "config",
        help="print every setting with its value, source and description",
        description="Print every setting (environment variable) with its current value, where "
        "the value comes from, and what it does. Tokens are never shown.",
    )
    shown = config.add_mutually_exclusive_group()
    shown.add_argument(
        "--markdown",
        action="store_true",
        help="print the README's table instead (variable, default, description)",
    )
    shown.add_argument(
        "--from-poseidon",
        metavar="FILE",
        help="print Poseidon's configuration.yaml FILE and the POSEIDON_* variables of this "
        "environment as our variables instead: NAME=value lines (tokens included), then a "
        "comment for each setting that does not carry over",
    )
    return parser


def _settings() -> Any:
    """The settings from the environment, or exit 2 with one line per problem."""
    from controller.config import ConfigError, load_settings

    try:
        return load_settings()
    except ConfigError as exc:
        print(f"nomad-runner-controller: invalid configuration:\n{exc}", file=sys.stderr)
        raise SystemExit(2) from None


def run_config(args: argparse.Namespace) -> int:
    from controller.config import describe, render_table

    if args.from_poseidon is not None:
        return run_from_poseidon(args.from_poseidon)
    settings = _settings()
    print(render_table(describe(settings), markdown=args.markdown))
    return 0


def run_from_poseidon(path: str) -> int:
    """`config --from-poseidon`: Poseidon's file and variables in our terms.
    Our own variables need not be valid for it: it is how they are made."""
    import os

    from controller import poseidon_config

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
        from_file = poseidon_config.read_yaml(text)
    except OSError as exc:
        return _poseidon_file_error(path, exc.strerror or str(exc))
    except UnicodeDecodeError:
        return _poseidon_file_error(path, "not UTF-8 text")
    except poseidon_config.PoseidonConfigError as exc:
        return _poseidon_file_error(path, str(exc))
    # The file first, then the variables: Poseidon's variables override its file.
    migration = poseidon_config.migrate(from_file, poseidon_config.read_environ(os.environ))
    print(poseidon_config.render(migration), end="")
    for problem in refusals(migration.variables()):
        print(f"# not accepted as is: {problem}")
    return 0


def _poseidon_file_error(path: str, why: str) -> int:
    print(f"nomad-runner-controller: --from-poseidon {path}: {why}", file=sys.stderr)
    return 2


def refusals(variables: dict[str, str]) -> list[str]:
    """What `run` would refuse in these variables alone (a Poseidon token
    shorter than ours allow, a file not found from here): our own checks'
    lines, which never show a secret."""
    from controller.config import ConfigError, load_settings

    try:
        settings = load_settings(variables)
    except ConfigError as exc:
        return list(exc.problems)
    problem = settings.open_api_problem()
    return [problem] if problem is not None else []


def run_smoke(args: argparse.Namespace) -> int:
    """`smoke`: one runner through every step against the API at --url."""
    import os

    from controller import smoke

    token = args.token if args.token is not None else os.environ.get("NRC_API_TOKEN")
    if not token:
        print(
            "nomad-runner-controller smoke: no token: give --token or set NRC_API_TOKEN",
            file=sys.stderr,
        )
        return 2
    options = smoke.Options(
        url=args.url, token=token, environment=args.environment, ca_file=args.ca_file
    )
    try:
        return smoke.run(options, sys.stdout, sys.stderr)
    except KeyboardInterrupt:
        # The runner, if claimed, was released on the way out.
        print("nomad-runner-controller smoke: interrupted", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # Its output's reader went away (`| head`): quiet, and no second
        # error when Python flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def run_sim(args: argparse.Namespace) -> int:
    from nomadsim import SimConfig, SimServer

    config = SimConfig(
        nodes=args.nodes,
        seed=args.seed,
        startup_delay_ms=args.startup_delay * 1000,
        stop_delay_ms=args.stop_delay * 1000,
        acl_token=args.acl_token,
        heartbeat_interval_ms=args.heartbeat_interval * 1000,
        migration_ordering=args.migration_ordering,
        **_topology(args),
        docker_stdin_close_on_exit=args.docker_stdin_close_on_exit,
        memory_oversubscription=args.memory_oversubscription,
    )
    try:
        server = SimServer(config, host=args.host, port=args.port)
    except (OSError, ValueError) as exc:
        print(f"nomad-runner-controller sim: {exc}", file=sys.stderr)
        return 2
    roles = {agent.name: agent.role.value for agent in server.sim.frontends.agents}
    print(
        sim_banner(
            server.address,
            {name: f"{roles[name]:8} {address}" for name, address in server.addresses.items()},
            server.setuser_path,
            args.acl_token,
            f"{args.nodes} nodes, {args.servers} servers, seed {args.seed}; "
            f"http_max_conns_per_client {args.http_max_conns_per_client}, "
            f"rpc_max_conns_per_client {args.rpc_max_conns_per_client}",
        ),
        flush=True,
    )
    from controller.gcpacing import CollectorPacer, Pacing

    pacer = CollectorPacer(Pacing(freeze_interval_s=args.gc_freeze_interval))
    pacer.start()
    try:
        server.serve_forever()
    finally:
        pacer.stop()
    return 0


def sim_banner(
    entry: str, agents: dict[str, str], setuser: str, token: str | None, shape: str
) -> str:
    """What `sim` prints: the cluster, then every setting `run` needs against
    it, as lines to paste into the shell that starts the controller."""
    import shlex

    lines = [f"Nomad simulator: {shape} (Ctrl-C stops)"]
    lines += [f"  {name:9} {where}" for name, where in sorted(agents.items())]
    lines += [
        "# the settings `nomad-runner-controller run` needs against it:",
        f"export NOMAD_ADDR={entry}",
        # The simulator's stand-in for /sbin/setuser, which this host lacks.
        f"export NRC_EXEC_UNPRIVILEGED_WRAPPER={shlex.quote(shlex.quote(setuser) + ' user')}",
    ]
    if token:
        lines.append(f"export NOMAD_TOKEN={shlex.quote(token)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "sim":
        return run_sim(args)
    if args.command == "config":
        return run_config(args)
    if args.command == "smoke":
        return run_smoke(args)
    if args.command in ("run", "dev"):
        from controller import service
        from controller.nomad.template_file import TemplateFileError

        settings = _settings()
        problem = settings.open_api_problem() if args.command == "run" else None
        if problem is not None:
            # Fail closed: an API without a token must not face the network.
            print(f"nomad-runner-controller: {problem}", file=sys.stderr)
            return 2
        try:
            if args.command == "run":
                return service.run(settings)
            return service.dev(settings, _topology(args))
        except TemplateFileError as exc:
            # Like a bad setting: the operator's to fix, one line, exit 2.
            print(f"nomad-runner-controller: NRC_TEMPLATE_JOB_FILE: {exc}", file=sys.stderr)
            return 2
    return 2  # argparse rejects unknown commands before this


if __name__ == "__main__":
    sys.exit(main())
