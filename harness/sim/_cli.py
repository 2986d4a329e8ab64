"""The simulator's command line: every ``SimConfig`` field is a flag, and an environment variable.

``python -m harness.sim --host 127.0.0.5 --port 8000 --model base --lora a,b --time-scale 0.05``

This is the entry point of the ``epp-harness/vllm-sim`` image in the node agent's image map, so a
pod's container ``args`` choose the model, the adapters, the limits, the vLLM release whose metric
names it publishes and the speed of simulated time. Each flag also has an environment variable,
``VLLM_SIM_<FLAG>`` (``--time-scale`` -> ``VLLM_SIM_TIME_SCALE``), read only when the flag is absent:
a container ``env`` entry then tunes a manifest whose args are someone else's (upstream's simulator
Deployment, say) without editing them.

``sim_args(config)`` is the inverse: the args that make a process run with ``config``, for pod specs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import uvloop

from harness.sim._admin import ADMIN_PORT_OFFSET
from harness.sim._config import DEFAULT_PORT, SimConfig

ENV_PREFIX: Final = "VLLM_SIM_"
POD_IP_ENV: Final = "EPP_HARNESS_POD_IP"
"""Set by the node agent in every container: the pod's address, which ``--host`` defaults to."""
_DEFAULTS: Final = SimConfig()
# Fields whose flag is not simply --<field-with-dashes>.
_FLAG_NAMES: Final = {"lora_adapters": "lora"}


def _flag(field: str) -> str:
    return _FLAG_NAMES.get(field, field).replace("_", "-")


def _env_name(field: str) -> str:
    return ENV_PREFIX + _FLAG_NAMES.get(field, field).upper()


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _parse_names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _converter(field: dataclasses.Field[Any]) -> Callable[[str], Any]:
    default = getattr(_DEFAULTS, field.name)
    if field.name == "lora_adapters":
        return _parse_names
    if field.name == "max_model_len":
        return int
    if isinstance(default, bool):
        return _parse_bool
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return float
    return str


def build_parser(prog: str = "python -m harness.sim") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="An OpenAI-compatible vLLM simulator. Every flag can also be given as VLLM_SIM_<FLAG>.",
    )
    parser.add_argument(
        "--host", default=None, help=f"loopback address to bind (default: ${POD_IP_ENV}, else 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--admin-port",
        type=int,
        default=None,
        help=f"port of the admin listener (default: --port + {ADMIN_PORT_OFFSET}; -1: none)",
    )
    parser.add_argument(
        "--fail-health", action="store_true", help="start with /health answering 503 (set it through admin)"
    )
    for field in dataclasses.fields(SimConfig):
        convert = _converter(field)
        parser.add_argument(
            f"--{_flag(field.name)}",
            dest=field.name,
            type=convert,
            default=None,
            help=f"{field.name} (default {getattr(_DEFAULTS, field.name)!r}; env {_env_name(field.name)})",
        )
    return parser


def config_from(args: argparse.Namespace, env: Mapping[str, str]) -> SimConfig:
    """The SimConfig the flags (else ``VLLM_SIM_*``, else the defaults) describe; ValueError if invalid."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(SimConfig):
        given = getattr(args, field.name, None)
        if given is None and _env_name(field.name) in env:
            text = env[_env_name(field.name)]
            try:
                given = _converter(field)(text)
            except ValueError as err:
                raise ValueError(f"{_env_name(field.name)}={text!r}: {err}") from err
        if given is not None:
            values[field.name] = given
    return SimConfig(**values)


def sim_args(config: SimConfig) -> list[str]:
    """The flags that make ``python -m harness.sim`` run with ``config`` (those that differ from defaults)."""
    args: list[str] = []
    for field in dataclasses.fields(SimConfig):
        value = getattr(config, field.name)
        if value == getattr(_DEFAULTS, field.name):
            continue
        if field.name == "lora_adapters":
            text = ",".join(value)
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = repr(value) if isinstance(value, float) else str(value)
        args.append(f"--{_flag(field.name)}={text}")
    return args


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    host: str
    port: int
    admin_port: int | None
    healthy: bool
    config: SimConfig
    pinned: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # gauges pinned at start


def serve_options(args: argparse.Namespace, env: Mapping[str, str]) -> ServeOptions:
    host = args.host or env.get(POD_IP_ENV) or "127.0.0.1"
    if not host.startswith("127."):
        raise ValueError("--host must be a loopback address (127.0.0.0/8)")
    admin = args.admin_port if args.admin_port is not None else args.port + ADMIN_PORT_OFFSET
    return ServeOptions(
        host=host,
        port=args.port,
        admin_port=None if admin < 0 else admin,
        healthy=not args.fail_health,
        config=config_from(args, env),
    )


async def serve(options: ServeOptions) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully: stop listening, finish requests in flight."""
    from harness.sim._server import ModelServerSim

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sim = ModelServerSim(
        options.host, options.port, options.config, admin_port=options.admin_port, healthy=options.healthy
    )
    if options.pinned:
        sim.set_gauges(**options.pinned)
    async with sim:
        admin = f", admin on {options.host}:{sim.admin_port}" if sim.admin_port is not None else ""
        print(f"simulator {sim.config.model!r} serving on {sim.base_url}{admin}", flush=True)
        await stop.wait()
        print("stopping: finishing the requests in flight", flush=True)


def run(options: ServeOptions) -> int:
    try:
        # On uvloop, as vLLM's uvicorn serves: a request costs the simulator less CPU (its reads and
        # writes above all), and many simulators share a test machine's cores with Envoy and the EPP.
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(options))
    except OSError as err:  # the address is taken, or not ours to bind
        print(f"error: cannot serve on {options.host}:{options.port}: {err}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        options = serve_options(args, os.environ if env is None else env)
    except ValueError as err:
        parser.error(str(err))
    return run(options)
