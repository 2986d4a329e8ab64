"""llm-d-inference-sim's command line, served by our simulator.

Upstream's manifests run ``ghcr.io/llm-d/llm-d-inference-sim`` (reference/peers-and-simulators.md
§3.1): ``--model meta-llama/Llama-3.1-8B-Instruct --port 8000 --max-loras 2 --lora food-review-1``
in early releases, ``--lora-modules '{"name": "food-review-1"}'`` later. The node agent maps that image
here, so such a Deployment runs unchanged: this module reads the image's flags (pflag syntax:
``--flag value`` or ``--flag=value``; list flags take every following value up to the next ``--flag``)
and turns the ones that mean something to our engine into a ``SimConfig``:

==========================  =======================================================================
``--model``                 the base model (the first ``--served-model-name``, if given, is the name
                            clients use)
``--port``                  the serving port (bound on the pod's address)
``--max-loras``             LoRA slots
``--lora`` (comma list)     adapters (early releases)
``--lora-modules``          adapters: JSON objects with ``name`` (vLLM's ``name=path`` also taken)
``--max-num-seqs``          running slots
``--max-model-len``         context window (unset: no check)
``--kv-cache-size``         KV blocks (``num_gpu_blocks``)
``--block-size``            KV block size in tokens
``--fake-metrics``          JSON: ``running-requests``, ``waiting-requests``, ``kv-cache-usage``, and
                            ``loras`` (the last entry's ``running``/``waiting``) pinned at start
==========================  =======================================================================

Every other flag of the real simulator is accepted and has no effect (its own latency model,
response modes, tool-call knobs, ZMQ events, datasets, TLS, failure injection: our engine has its
own step-time model); an unknown flag fails the container at start, as the real binary does. The
speed of simulated time and anything else ``SimConfig`` knows can still be set with ``VLLM_SIM_*``
environment variables (``harness.sim._cli``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

from harness.sim._admin import ADMIN_PORT_OFFSET
from harness.sim._cli import POD_IP_ENV, ServeOptions, config_from, run
from harness.sim._config import DEFAULT_PORT, SimConfig

_SCALAR: Final = {
    "model": str,
    "port": int,
    "max-loras": int,
    "max-num-seqs": int,
    "max-model-len": int,
    "kv-cache-size": int,
    "block-size": int,
}
_LISTS: Final = frozenset({"served-model-name", "lora-modules", "fake-metrics", "failure-types"})
_BOOLEANS: Final = frozenset(
    {"enable-kvcache", "dataset-in-memory", "enable-sleep-mode", "self-signed-certs"}
)
_IGNORED: Final = frozenset(
    {
        "max-cpu-loras", "max-waiting-queue-length", "mode", "seed", "time-to-first-token",
        "time-to-first-token-std-dev", "inter-token-latency", "inter-token-latency-std-dev",
        "kv-cache-transfer-latency", "kv-cache-transfer-latency-std-dev", "prefill-overhead",
        "prefill-time-per-token", "prefill-time-std-dev", "kv-cache-transfer-time-per-token",
        "kv-cache-transfer-time-std-dev", "time-factor-under-load", "max-tool-call-integer-param",
        "min-tool-call-integer-param", "max-tool-call-number-param", "min-tool-call-number-param",
        "max-tool-call-array-param-length", "min-tool-call-array-param-length",
        "tool-call-not-required-param-probability", "object-tool-call-not-required-field-probability",
        "tokenizers-cache-dir", "hash-seed", "zmq-endpoint", "zmq-max-connect-attempts",
        "event-batch-size", "data-parallel-size", "dataset-path", "dataset-url", "failure-injection-rate",
        "ssl-certfile", "ssl-keyfile", "config", "render-url", "v", "vmodule", "log_dir", "log_file",
        "logtostderr", "alsologtostderr", "stderrthreshold", "one_output", "skip_headers",
        "skip_log_headers", "add_dir_header", "log_file_max_size",
    }
)  # fmt: skip
_LORA_LIST: Final = "lora"


class FlagError(ValueError):
    """The arguments are not the real simulator's; the container fails at start, as it would."""


@dataclasses.dataclass
class Parsed:
    scalars: dict[str, str] = dataclasses.field(default_factory=dict)
    lists: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    loras: list[str] = dataclasses.field(default_factory=list)
    ignored: list[str] = dataclasses.field(default_factory=list)


def parse(argv: Sequence[str]) -> Parsed:
    """pflag's shapes, as the real binary reads them (list flags take values up to the next ``--``)."""
    parsed = Parsed()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg in ("-", "--"):
            raise FlagError(f"unexpected argument {arg!r}")
        name, has_value, value = arg.lstrip("-").partition("=")
        i += 1
        if name in _LISTS:
            values = [value] if has_value else []
            while not has_value and i < len(argv) and not argv[i].startswith("--"):
                if argv[i]:
                    values.append(argv[i])
                i += 1
            parsed.lists.setdefault(name, []).extend(values)
            continue
        if name in _BOOLEANS:
            parsed.ignored.append(name)
            continue
        if name not in _SCALAR and name not in _IGNORED and name != _LORA_LIST:
            raise FlagError(f"unknown flag: --{name}")
        if not has_value:
            if i >= len(argv):
                raise FlagError(f"flag needs an argument: --{name}")
            value, i = argv[i], i + 1
        if name == _LORA_LIST:
            parsed.loras.extend(v.strip() for v in value.split(",") if v.strip())
        elif name in _SCALAR:
            parsed.scalars[name] = value
        else:
            parsed.ignored.append(name)
    return parsed


def _lora_module_name(text: str) -> str:
    """One ``--lora-modules`` value: a JSON object with ``name``, or vLLM's ``name=path``."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            module = json.loads(stripped)
        except ValueError as err:
            raise FlagError(f"--lora-modules: not JSON: {stripped!r}") from err
        name = module.get("name") if isinstance(module, dict) else None
        if not isinstance(name, str) or not name:
            raise FlagError(f"--lora-modules: no name in {stripped!r}")
        return name
    return stripped.partition("=")[0]


def _pinned(fake_metrics: Sequence[str]) -> dict[str, Any]:
    if not fake_metrics:
        return {}
    try:
        metrics = json.loads(fake_metrics[0])
    except ValueError as err:
        raise FlagError(f"--fake-metrics: not JSON: {fake_metrics[0]!r}") from err
    if not isinstance(metrics, dict):
        raise FlagError("--fake-metrics: expected a JSON object")
    pinned: dict[str, Any] = {}
    for key, gauge in (("running-requests", "running"), ("waiting-requests", "waiting"),
                       ("kv-cache-usage", "kv_cache")):  # fmt: skip
        if key in metrics:
            pinned[gauge] = float(metrics[key])
    loras = metrics.get("loras") or []
    if loras:
        last = loras[-1] if isinstance(loras[-1], dict) else json.loads(loras[-1])
        pinned["running_loras"] = tuple(n for n in str(last.get("running", "")).split(",") if n)
        pinned["waiting_loras"] = tuple(n for n in str(last.get("waiting", "")).split(",") if n)
    return pinned


def serve_options(argv: Sequence[str], env: Mapping[str, str]) -> ServeOptions:
    """What our simulator serves for these llm-d-inference-sim arguments (FlagError if malformed)."""
    parsed = parse(argv)
    try:
        scalars = {name: _SCALAR[name](value) for name, value in parsed.scalars.items()}
    except ValueError as err:
        raise FlagError(f"invalid flag value: {err}") from err
    adapters = [*parsed.loras, *(_lora_module_name(m) for m in parsed.lists.get("lora-modules", []))]
    served = parsed.lists.get("served-model-name") or []
    flags: dict[str, Any] = {
        "model": served[0] if served else scalars.get("model"),
        "lora_adapters": tuple(dict.fromkeys(adapters)) if adapters else None,
        "max_loras": scalars.get("max-loras"),
        "max_num_seqs": scalars.get("max-num-seqs"),
        "max_model_len": scalars.get("max-model-len"),
        "num_gpu_blocks": scalars.get("kv-cache-size"),
        "block_size": scalars.get("block-size"),
    }
    namespace = _namespace(flags)
    try:
        config: SimConfig = config_from(namespace, env)
    except ValueError as err:
        raise FlagError(str(err)) from err
    if config.lora_adapters and config.max_loras < 1:
        config = dataclasses.replace(config, max_loras=1)
    port = int(scalars.get("port", DEFAULT_PORT))
    return ServeOptions(
        host=env.get(POD_IP_ENV, "127.0.0.1"),
        port=port,
        admin_port=port + ADMIN_PORT_OFFSET,
        healthy=True,
        config=config,
        pinned=_pinned(parsed.lists.get("fake-metrics", [])),
    )


def _namespace(flags: Mapping[str, Any]) -> Any:
    import argparse

    return argparse.Namespace(**{f.name: flags.get(f.name) for f in dataclasses.fields(SimConfig)})


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    try:
        options = serve_options(sys.argv[1:] if argv is None else argv, os.environ if env is None else env)
    except (FlagError, ValueError) as err:
        print(f"Error: {err}", file=sys.stderr, flush=True)
        return 1
    return run(options)
