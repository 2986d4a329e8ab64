"""Command-line flags with upstream's names, and the scheduler thresholds from the environment.

This is the only place that reads argv and the environment (STYLE habit 9); everything becomes a
frozen `ServerConfig`. Like Go's `flag` package, a flag may be written with one dash or two, and as
`-name value` or `-name=value`; durations are Go duration strings (`50ms`, `5s`, `1m30s`).

Names (README, "Running the EPP", has the table): upstream v1.5.0's kebab-case names are primary
(`--pool-name`, `--grpc-port`, ...), upstream v0.3.0's camelCase names are aliases of them
(`--poolName`, `--grpcPort`, ...), and our own flags follow the same pattern (`--bind-address`,
alias `--bindAddress`). `--help` shows each flag once, its alias beside it.
- Upstream v1.5.0 refuses its metric-name flags (`--kv-cache-usage-percentage-metric`, ...) and
  so does this EPP, with the same advice (engineConfigs in an EndpointPickerConfig); v0.3.0's
  `--totalQueuedRequestsMetric`, `--kvCacheUsagePercentageMetric` and `--loraInfoMetric` keep
  working and set the default engine's names.
- Upstream flags with nothing to drive here are accepted so its manifests start this EPP
  (`NO_OP_FLAGS`: `--tracing`, `--enable-pprof`, `--health-checking`, `--metrics-endpoint-auth`,
  `--enable-cert-reload`); when set to true, `Flags.notes` says
  once what happens instead. `--refresh-prometheus-metrics-interval` is accepted too: pool gauges
  are computed at scrape time (epp.metrics.pool).
- `--config-file` / `--config-text`: an EndpointPickerConfig (epp.pickerconfig); its settings win
  over flags and environment, and a file that cannot be used as written stops the start.
- Ours: `--bind-address` (tests and the harness bind to loopback only), `--debug-port` /
  `--debug-bind-address` (the datastore debug view on 127.0.0.1 unless asked otherwise, DESIGN.md
  §6), `--metrics-bind-address` (/metrics alone on another address), `--max-request-body-bytes`
  (DESIGN.md §6), `--watch-bookmark-interval` (the watch liveness rule), `--shutdown-delay` and
  `--shutdown-grace-period` (the drain on SIGTERM, DESIGN.md §4), `--ext-proc-transport` (`h2` or
  `grpcio`), `--event-loop` (`auto`, `uvloop`, `asyncio`), `--scheduler`, `--kubeconfig`.

Logging: upstream's manifests pass controller-runtime's zap flags, so they are accepted and mapped
to Python logging: `--zap-log-level` (debug, info, error, panic, or a number N meaning `-v N`)
overrides `-v`; `--zap-encoder` json|console; `--zap-devel` means debug level unless a level is
given. `--zap-stacktrace-level` and `--zap-time-encoding` are accepted and checked but change
nothing: Python logs a traceback with every error it reports, and JSON lines carry epoch seconds.

A value that cannot work (a NaN threshold, metrics refreshed less often than they go stale) is a
`FlagError` naming the flag or environment variable: the EPP exits with 2 instead of starting.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn, TypeVar

from epp import config as defaults
from epp.config import (
    ConfigError,
    LeaderElectionConfig,
    MetricNames,
    ProberConfig,
    SchedulerConfig,
    ScorerWeights,
    ServerConfig,
    WatchConfig,
)
from epp.h2.limits import Limits
from epp.pickerconfig import PickerConfigError, load_picker_config

log = logging.getLogger(__name__)

DEFAULT_VERBOSITY = 2
# zap levels as upstream: 2 default, 3 verbose, 4 debug, 5 trace. Python has no finer level than DEBUG.
DEBUG_VERBOSITY = 4

T = TypeVar("T")


class FlagError(ValueError):
    """Bad command line; the message says which flag and why."""


# zap's named levels, as Python levels (zap's dpanic/panic/fatal all mean "only the worst").
_ZAP_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "dpanic": logging.CRITICAL,
    "panic": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}
LOG_ENCODERS = ("console", "json")
_ZAP_TIME_ENCODINGS = ("epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano")

# Where each setting comes from, to name it in an error (see ConfigError.setting).
# Where each setting comes from, to name it in an error (see ConfigError.setting): the variable, or
# the flag with its v0.3 alias.
_SOURCES = {
    "kv_cache_threshold": "KV_CACHE_THRESHOLD",
    "queue_threshold_critical": "QUEUE_THRESHOLD_CRITICAL",
    "queueing_threshold_lora": "QUEUING_THRESHOLD_LORA",
    "lora_affinity_threshold": "LORA_AFFINITY_THRESHOLD",
    "metrics_staleness_threshold": "--metrics-staleness-threshold (--metricsStalenessThreshold)",
    "refresh_interval": "--refresh-metrics-interval (--refreshMetricsInterval)",
    "refresh_prometheus_metrics_interval": "--refresh-prometheus-metrics-interval "
    "(--refreshPrometheusMetricsInterval)",
    "max_request_body_bytes": "--max-request-body-bytes (--maxRequestBodyBytes)",
    "watch_bookmark_interval": "--watch-bookmark-interval (--watchBookmarkInterval)",
    "shutdown_delay": "--shutdown-delay (--shutdownDelay)",
    "shutdown_grace_period": "--shutdown-grace-period (--shutdownGracePeriod)",
    "metrics_path": "--model-server-metrics-path",
    "endpoint_target_ports": "--endpoint-target-ports",
    "endpoint_selector": "--endpoint-selector",
    "destination_fallbacks": "--destination-endpoint-fallbacks",
}


@dataclass(frozen=True, slots=True)
class Flags:
    config: ServerConfig
    verbosity: int = DEFAULT_VERBOSITY
    # `--zap-log-level` (or `--zap-devel`), which wins over `-v`; None when not given.
    level_override: int | None = None
    log_encoder: str = "console"
    # One line each, for the entry point to log once logging is set up: flags accepted that change
    # nothing here, and the same for a config file's entries.
    notes: tuple[str, ...] = ()

    @property
    def log_level(self) -> int:
        if self.level_override is not None:
            return self.level_override
        return logging.DEBUG if self.verbosity >= DEBUG_VERBOSITY else logging.INFO


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Seconds from a Go duration string (`time.ParseDuration`): `300ms`, `1.5s`, `1h2m`, `0`."""
    s = text.strip()
    sign = 1.0
    if s and s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    pos = 0
    while pos < len(s):
        match = _DURATION_PART.match(s, pos)
        if match is None:
            raise ValueError(f"invalid duration {text!r} (expected e.g. 50ms, 5s, 1m30s)")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return sign * total


def _non_negative_duration(text: str) -> float:
    seconds = parse_go_duration(text)
    if seconds < 0:
        raise ValueError(f"duration must not be negative, got {text!r}")
    return seconds


def _positive_duration(text: str) -> float:
    seconds = parse_go_duration(text)
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    return seconds


_BYTE_UNITS = {"": 1, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}
_BYTE_SIZE = re.compile(r"(\d+)(Ki|Mi|Gi)?")


def parse_byte_size(text: str) -> int:
    """Bytes from `16777216` or a Kubernetes-style binary suffix: `512Ki`, `16Mi`, `1Gi`."""
    match = _BYTE_SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"invalid size {text!r} (expected e.g. 16777216, 512Ki, 16Mi)")
    return int(match.group(1)) * _BYTE_UNITS[match.group(2) or ""]


def _zap_level(text: str) -> int:
    """A zap level name, or a number N > 0 meaning verbosity N (as `-v N`)."""
    if text.isdigit() and int(text) > 0:
        return logging.DEBUG if int(text) >= DEBUG_VERBOSITY else logging.INFO
    try:
        return _ZAP_LEVELS[text.lower()]
    except KeyError:
        raise ValueError(
            f"invalid zap log level {text!r} (debug, info, error, panic or a number > 0)"
        ) from None


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"invalid value {text!r} (one of: {', '.join(allowed)})")
        return text

    return parse


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {port} (0 picks a free port)")
    return port


_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def _label_selector(text: str) -> tuple[tuple[str, str], ...]:
    """`key=value,key2=value2` (upstream's `--endpoint-selector`): equality only, no spaces."""
    pairs: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        if not eq or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            raise ValueError(f"invalid selector {text!r}: expected key=value pairs separated by commas")
        if key in pairs:
            raise ValueError(f"invalid selector {text!r}: {key!r} given twice")
        pairs[key] = value
    return tuple(pairs.items())


def _port_list(text: str) -> list[int]:
    """`3000,3001` (pflag's int slice; the flag may also be repeated)."""
    ports = []
    for part in text.split(","):
        port = int(part)
        if not 1 <= port <= 65535:
            raise ValueError(f"port out of range: {port}")
        ports.append(port)
    return ports


_TRUE = {"1", "t", "T", "true", "TRUE", "True"}
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}


def _go_bool(text: str) -> bool:
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"invalid boolean {text!r}")


def _typed(convert: Callable[[str], T], what: str) -> Callable[[str], T]:
    def parse(text: str) -> T:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc) or f"invalid {what}: {text!r}") from exc

    parse.__name__ = what
    return parse


class _HelpFormatter(argparse.HelpFormatter):
    """`--grpc-port PORT, --grpcPort PORT`: the value's kind, not the flag's name, as metavar."""

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        kind = getattr(action.type, "__name__", "") if action.type is not None else ""
        return kind.replace(" ", "_").upper() if kind and kind != "str" else "TEXT"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise FlagError(message)


# Upstream v1.5.0 moved these into the config file and refuses them when set; the same advice here.
REFUSED_METRIC_FLAGS = (
    "--total-queued-requests-metric",
    "--total-running-requests-metric",
    "--kv-cache-usage-percentage-metric",
    "--lora-info-metric",
    "--cache-info-metric",
)


class _Refused(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        raise FlagError(
            f"flag {option_string!r} is deprecated and cannot be used; configure metrics via engineConfigs "
            "in EndpointPickerConfig instead (the v0.3 names --totalQueuedRequestsMetric, "
            "--kvCacheUsagePercentageMetric and --loraInfoMetric still work)"
        )


# Upstream v1.5.0 flags accepted for its manifests, that change nothing here: what each does instead.
# Said once at start (`Flags.notes`) when the flag is given as true.
NO_OP_FLAGS = {
    "tracing": "--tracing: tracing is not implemented; no spans are exported (OTEL_* variables are ignored)",
    "enable_pprof": "--enable-pprof: pprof is Go's profiler; this EPP has none",
    "health_checking": "--health-checking: gRPC health is always served on --grpc-health-port for any "
    "service name; the ext_proc port serves no health service",
    "metrics_endpoint_auth": "--metrics-endpoint-auth: not implemented; /metrics is served without "
    "authentication (bind it to loopback with --metrics-bind-address behind an authenticating proxy)",
    "enable_cert_reload": "--enable-cert-reload: not implemented; the certificate is read once at start",
}


def _parser() -> _Parser:
    p = _Parser(
        prog="epp",
        usage="epp (--pool-name NAME | --endpoint-selector KEY=VALUE --endpoint-target-ports PORTS) [flags]",
        formatter_class=_HelpFormatter,
        description="Endpoint picker for LLM inference (ext_proc). Flags as upstream v1.5.0 names them; "
        "upstream v0.3.0's camelCase names are accepted as aliases (shown beside each).",
        allow_abbrev=False,
    )
    duration, port, go_bool = (
        _typed(_positive_duration, "duration"),
        _typed(_port, "port"),
        _typed(_go_bool, "bool"),
    )

    up = p.add_argument_group("upstream v1.5.0 flags")

    def flag_bool(*names: str, default: bool | None, help: str) -> None:
        up.add_argument(
            *names, type=go_bool, nargs="?", const=True, default=default, metavar="BOOL", help=help
        )

    up.add_argument("--pool-name", "--poolName", default="", help="The InferencePool this EPP serves.")
    up.add_argument(
        "--pool-namespace",
        "--poolNamespace",
        default="",
        help="The pool's namespace; empty: $NAMESPACE, else default.",
    )
    up.add_argument(
        "--pool-group",
        type=_typed(_choice(*defaults.POOL_GROUPS), "group"),
        default=defaults.DEFAULT_POOL_GROUP,
        help=f"API group of the pool: {defaults.V1_POOL_GROUP} (v1) or {defaults.V1ALPHA2_POOL_GROUP} "
        "(v1alpha2, with InferenceModels).",
    )
    up.add_argument(
        "--endpoint-selector",
        type=_typed(_label_selector, "selector"),
        default=(),
        help="Standalone mode, instead of --pool-name: pods with these labels (key=value,key2=value2).",
    )
    up.add_argument(
        "--endpoint-target-ports",
        type=_typed(_port_list, "ports"),
        action="extend",
        default=[],
        help=f"With --endpoint-selector: 1 to {defaults.MAX_TARGET_PORTS} ports (3000,3001).",
    )
    flag_bool(
        "--disable-endpoint-subset-filter",
        default=False,
        help="Ignore the proxy's x-gateway-destination-endpoint-subset hint.",
    )
    up.add_argument(
        "--grpc-port", "--grpcPort", type=port, default=defaults.DEFAULT_GRPC_PORT, help="ext_proc port."
    )
    up.add_argument(
        "--grpc-health-port",
        "--grpcHealthPort",
        type=port,
        default=defaults.DEFAULT_GRPC_HEALTH_PORT,
        help="gRPC health port (plaintext).",
    )
    up.add_argument(
        "--metrics-port",
        "--metricsPort",
        type=port,
        default=defaults.DEFAULT_METRICS_PORT,
        help="/metrics port.",
    )
    flag_bool("--secure-serving", "--secureServing", default=True, help="TLS on the ext_proc port.")
    up.add_argument(
        "--cert-path",
        "--certPath",
        default="",
        help="Directory with tls.crt and tls.key; empty: self-signed.",
    )
    up.add_argument(
        "--refresh-metrics-interval",
        "--refreshMetricsInterval",
        type=duration,
        default=defaults.DEFAULT_REFRESH_METRICS_INTERVAL,
        help="How often each pod's /metrics is scraped (50ms).",
    )
    up.add_argument(
        "--refresh-prometheus-metrics-interval",
        "--refreshPrometheusMetricsInterval",
        type=duration,
        default=defaults.DEFAULT_REFRESH_PROMETHEUS_METRICS_INTERVAL,
        help="Accepted; pool gauges are computed at scrape time.",
    )
    up.add_argument(
        "--metrics-staleness-threshold",
        "--metricsStalenessThreshold",
        type=duration,
        default=defaults.DEFAULT_METRICS_STALENESS_THRESHOLD,
        help="Metrics older than this do not count as fresh (2s).",
    )
    up.add_argument(
        "--model-server-metrics-scheme",
        type=_typed(_choice(*defaults.METRICS_SCHEMES), "scheme"),
        default=None,
        help="Scheme of the pods' metrics endpoint (http).",
    )
    up.add_argument("--model-server-metrics-path", default=None, help="Path of the pods' metrics (/metrics).")
    up.add_argument(
        "--model-server-metrics-port",
        type=port,
        default=None,
        help="Port of the pods' metrics; 0: the target port (deprecated upstream).",
    )
    flag_bool(
        "--model-server-metrics-https-insecure-skip-verify",
        default=None,
        help="With https: do not verify the pods' certificates (true).",
    )
    up.add_argument("--config-file", default="", help="An EndpointPickerConfig file (scheduling, engines).")
    up.add_argument("--config-text", default="", help="The same as text, instead of --config-file.")
    up.add_argument(
        "--v", type=_typed(int, "int"), default=DEFAULT_VERBOSITY, help="Log verbosity, also -v (4: debug)."
    )
    # controller-runtime's zap flags, as upstream's manifests pass them (see the module docstring).
    up.add_argument(
        "--zap-log-level", type=_typed(_zap_level, "zap level"), default=None, help="debug, info, error or N."
    )
    up.add_argument("--zap-encoder", type=_typed(_choice(*LOG_ENCODERS), "encoder"), help="json or console.")
    up.add_argument(
        "--zap-devel", type=go_bool, nargs="?", const=True, default=False, metavar="BOOL", help="Debug level."
    )
    up.add_argument(
        "--zap-stacktrace-level", type=_typed(_zap_level, "zap level"), help="Accepted, changes nothing."
    )
    up.add_argument(
        "--zap-time-encoding",
        type=_typed(_choice(*_ZAP_TIME_ENCODINGS), "encoding"),
        help="Accepted, changes nothing.",
    )
    for name in ("--tracing", "--enable-pprof", "--health-checking", "--metrics-endpoint-auth"):
        flag_bool(name, default=None, help="Accepted, changes nothing here (README).")
    flag_bool("--enable-cert-reload", default=None, help="Accepted; the certificate is read at start.")
    # Upstream's HA mode (epp.k8s.leader): only the Lease holder reports SERVING. Identity: $POD_NAME.
    flag_bool(
        "--ha-enable-leader-election",
        default=None,
        help="Only the holder of a coordination.k8s.io Lease is SERVING (default: active-active).",
    )
    for name in REFUSED_METRIC_FLAGS:
        up.add_argument(name, action=_Refused, nargs="?", help=argparse.SUPPRESS)

    v03 = p.add_argument_group("upstream v0.3.0 flags (upstream v1 has none of these)")
    v03.add_argument(
        "--totalQueuedRequestsMetric",
        default=None,
        help="The default engine's queue metric (name or name{k=v}; empty: off).",
    )
    v03.add_argument(
        "--kvCacheUsagePercentageMetric", default=None, help="The default engine's KV-cache metric."
    )
    v03.add_argument("--loraInfoMetric", default=None, help="The default engine's LoRA metric.")
    v03.add_argument(
        "--destination-endpoint-hint-key",
        "--destinationEndpointHintKey",
        default=defaults.DEFAULT_DESTINATION_ENDPOINT_HINT_KEY,
        help="Header and metadata key of the destination.",
    )
    v03.add_argument(
        "--destination-endpoint-hint-metadata-namespace",
        "--DestinationEndpointHintMetadataNamespace",
        default=defaults.DEFAULT_DESTINATION_ENDPOINT_HINT_METADATA_NAMESPACE,
        help="Dynamic metadata namespace of the destination.",
    )

    ours = p.add_argument_group("this EPP's own flags")
    ours.add_argument(
        "--kubeconfig", default="", help="Kubeconfig path; empty: $KUBECONFIG, in-cluster, ~/.kube."
    )
    ours.add_argument(
        "--bind-address",
        "--bindAddress",
        default="0.0.0.0",
        help="Address ext_proc, health and /metrics bind to.",
    )
    ours.add_argument(
        "--metrics-bind-address",
        "--metricsBindAddress",
        default="",
        help="Address of /metrics alone; empty: --bind-address.",
    )
    ours.add_argument(
        "--debug-port",
        "--debugPort",
        type=port,
        default=defaults.DEFAULT_DEBUG_PORT,
        help="/debug/datastore port.",
    )
    ours.add_argument(
        "--debug-bind-address",
        "--debugBindAddress",
        default=defaults.DEFAULT_DEBUG_BIND_ADDRESS,
        help="Address of /debug/datastore; loopback unless you mean to expose it.",
    )
    ours.add_argument(
        "--scheduler",
        choices=defaults.SCHEDULERS,
        default=None,
        help="The v0.3.0 filter tree, or weighted scorers (queue, KV, LoRA affinity, prefix, the EPP's own "
        "in-flight count; weights from QUEUE_SCORE_WEIGHT, KV_CACHE_SCORE_WEIGHT, "
        "LORA_AFFINITY_SCORE_WEIGHT, "
        "PREFIX_CACHE_SCORE_WEIGHT, IN_FLIGHT_SCORE_WEIGHT); default scorer. A config file's profile "
        "replaces it.",
    )
    ours.add_argument(
        "--max-request-body-bytes",
        "--maxRequestBodyBytes",
        type=_typed(parse_byte_size, "size"),
        default=defaults.DEFAULT_MAX_REQUEST_BODY_BYTES,
        help="Largest request body accepted (413 above it); bytes or 512Ki/16Mi/1Gi.",
    )
    wait = _typed(_non_negative_duration, "duration")
    ours.add_argument(
        "--watch-bookmark-interval",
        "--watchBookmarkInterval",
        type=duration,
        default=defaults.DEFAULT_WATCH_BOOKMARK_INTERVAL,
        help="Each watch of the API ends after this long (+0..25%%) and one that reads nothing for "
        "twice this long is replaced as dead.",
    )
    ours.add_argument(
        "--shutdown-delay",
        "--shutdownDelay",
        type=wait,
        default=defaults.DEFAULT_SHUTDOWN_DELAY,
        help="On SIGTERM, health says NOT_SERVING and ext_proc keeps serving this long.",
    )
    ours.add_argument(
        "--shutdown-grace-period",
        "--shutdownGracePeriod",
        type=wait,
        default=defaults.DEFAULT_SHUTDOWN_GRACE_PERIOD,
        help="Then new streams are refused and those in flight get this long to finish.",
    )
    ours.add_argument(
        "--ext-proc-transport",
        "--extProcTransport",
        choices=defaults.EXT_PROC_TRANSPORTS,
        default=defaults.DEFAULT_EXT_PROC_TRANSPORT,
        help="How the ext_proc port serves gRPC: h2 (ours, on asyncio) or grpcio (grpc.aio).",
    )
    ours.add_argument(
        "--event-loop",
        "--eventLoop",
        choices=defaults.EVENT_LOOPS,
        default=defaults.AUTO_EVENT_LOOP,
        help="The event loop: auto (uvloop if installed, else asyncio's), uvloop or asyncio.",
    )
    _request_protocol_flags(ours)
    _add_h2_flags(ours)
    return p


def _request_protocol_flags(ours: argparse._ArgumentGroup) -> None:
    """Our knob of the v1 request protocol (epp.handlers); upstream's subset switch is with its flags."""
    ours.add_argument(
        "--destination-endpoint-fallbacks",
        dest="destination_endpoint_fallbacks",
        type=_typed(int, "int"),
        default=defaults.DEFAULT_DESTINATION_FALLBACKS,
        help="Fallback endpoints after the pick in the destination comma list, from the same ranking "
        f"(default 0, as upstream; {defaults.RECOMMENDED_DESTINATION_FALLBACKS} behind a list-aware "
        "proxy such as Envoy's override_host; ORIGINAL_DST reads one address and needs 0).",
    )


_NUMBER = re.compile(r"^-\.?\d")


def go_style(argv: Sequence[str]) -> list[str]:
    """`-name` → `--name` (Go accepts both); negative numbers and everything after `--` untouched."""
    out: list[str] = []
    rest = False
    for arg in argv:
        if rest or arg == "--":
            rest = True
        elif arg.startswith("-") and not arg.startswith("--") and len(arg) > 1 and not _NUMBER.match(arg):
            arg = "-" + arg
        out.append(arg)
    return out


def _env(environ: Mapping[str, str], name: str, convert: Callable[[str], T], default: T) -> T:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return convert(raw)
    except ValueError:
        log.warning(
            "ignoring %s=%r: not a valid %s; using the default %r", name, raw, type(default).__name__, default
        )
        return default


def scorer_weights(environ: Mapping[str, str]) -> ScorerWeights:
    """The scorer scheduler's weights; a negative or unparsable value falls back to the default."""
    base = ScorerWeights()

    def weight(name: str, default: float) -> float:
        value = _env(environ, name, float, default)
        if value < 0 or value != value:  # negative or NaN
            log.warning("ignoring %s=%r: weights must be >= 0; using the default %r", name, value, default)
            return default
        return value

    return ScorerWeights(
        queue=weight("QUEUE_SCORE_WEIGHT", base.queue),
        kv_cache=weight("KV_CACHE_SCORE_WEIGHT", base.kv_cache),
        prefix=weight("PREFIX_CACHE_SCORE_WEIGHT", base.prefix),
        lora=weight("LORA_AFFINITY_SCORE_WEIGHT", base.lora),
        in_flight=weight("IN_FLIGHT_SCORE_WEIGHT", base.in_flight),
    )


def scheduler_config(
    environ: Mapping[str, str], staleness: float, kind: str = defaults.DEFAULT_SCHEDULER
) -> SchedulerConfig:
    """Upstream's env-tunable thresholds (v0.3.0); an unparsable value falls back to the default."""
    return SchedulerConfig(
        kind=kind,
        weights=scorer_weights(environ),
        kv_cache_threshold=_env(environ, "KV_CACHE_THRESHOLD", float, defaults.DEFAULT_KV_CACHE_THRESHOLD),
        queue_threshold_critical=_env(
            environ, "QUEUE_THRESHOLD_CRITICAL", int, defaults.DEFAULT_QUEUE_THRESHOLD_CRITICAL
        ),
        queueing_threshold_lora=_env(
            environ, "QUEUING_THRESHOLD_LORA", int, defaults.DEFAULT_QUEUEING_THRESHOLD_LORA
        ),
        lora_affinity_threshold=_env(
            environ, "LORA_AFFINITY_THRESHOLD", float, defaults.DEFAULT_LORA_AFFINITY_THRESHOLD
        ),
        metrics_staleness_threshold=staleness,
    )


def parse_flags(argv: Sequence[str], environ: Mapping[str, str]) -> Flags:
    """argv (without the program name) and the environment → settings; raises FlagError.

    The only I/O: reading `--config-file`."""
    ns = _parser().parse_args(go_style(argv))
    if bool(ns.pool_name) == bool(ns.endpoint_selector):
        raise FlagError(
            "either --pool-name (--poolName) or --endpoint-selector must be set, not both"
            if ns.pool_name
            else "either --pool-name (--poolName) or --endpoint-selector must be set"
        )
    if ns.config_file and ns.config_text:
        raise FlagError("--config-file and --config-text cannot both be set")
    if ns.refresh_metrics_interval > ns.metrics_staleness_threshold:
        raise FlagError(
            "--refresh-metrics-interval (--refreshMetricsInterval, "
            f"{ns.refresh_metrics_interval:g}s) must not be longer than --metrics-staleness-threshold "
            "(--metricsStalenessThreshold, "
            f"{ns.metrics_staleness_threshold:g}s): every pod would look stale"
        )
    notes = [text for dest, text in NO_OP_FLAGS.items() if getattr(ns, dest)]
    try:
        config = _server_config(ns, environ, notes)
    except ConfigError as exc:
        source = _SOURCES.get(exc.setting, exc.setting)
        raise FlagError(f"{source}={exc.value!r}: {exc.rule}") from exc
    level = ns.zap_log_level
    if level is None and ns.zap_devel:
        level = logging.DEBUG  # controller-runtime's development mode logs at debug
    return Flags(
        config=config,
        verbosity=ns.v,
        level_override=level,
        log_encoder=ns.zap_encoder or "console",
        notes=tuple(notes),
    )


def _metric_names(ns: argparse.Namespace) -> MetricNames:
    """The default engine's names, with the v0.3 metric flags applied."""
    base = MetricNames()
    kv_metric = (
        base.kv_cache_usage if ns.kvCacheUsagePercentageMetric is None else ns.kvCacheUsagePercentageMetric
    )
    return MetricNames(
        queued_requests=base.queued_requests
        if ns.totalQueuedRequestsMetric is None
        else ns.totalQueuedRequestsMetric,
        kv_cache_usage=kv_metric,
        # The vLLM fallback only makes sense for the vLLM default; a custom name stands alone.
        kv_cache_usage_fallback=(
            defaults.FALLBACK_KV_CACHE_USAGE_METRIC
            if kv_metric == defaults.DEFAULT_KV_CACHE_USAGE_METRIC
            else ""
        ),
        lora_info=base.lora_info if ns.loraInfoMetric is None else ns.loraInfoMetric,
    )


def _prober_config(ns: argparse.Namespace) -> ProberConfig:
    base = ProberConfig()
    return ProberConfig(
        refresh_interval=ns.refresh_metrics_interval,
        metric_names=_metric_names(ns),
        scheme=base.scheme if ns.model_server_metrics_scheme is None else ns.model_server_metrics_scheme,
        path=base.path if ns.model_server_metrics_path is None else ns.model_server_metrics_path,
        port=base.port if ns.model_server_metrics_port is None else ns.model_server_metrics_port,
        insecure_skip_verify=(
            base.insecure_skip_verify
            if ns.model_server_metrics_https_insecure_skip_verify is None
            else ns.model_server_metrics_https_insecure_skip_verify
        ),
    )


def _picker_config(
    ns: argparse.Namespace, scheduler: SchedulerConfig, prober: ProberConfig, notes: list[str]
) -> tuple[SchedulerConfig, ProberConfig]:
    """Apply `--config-file` / `--config-text`, if any: the file's settings win over flags and env."""
    if ns.config_file:
        source = f"--config-file {ns.config_file}"
        try:
            with open(ns.config_file, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise FlagError(f"{source}: cannot read it: {exc.strerror or exc}") from exc
    elif ns.config_text:
        source, text = "--config-text", ns.config_text
    else:
        return scheduler, prober
    try:
        loaded = load_picker_config(text, scheduler=scheduler, prober=prober)
    except PickerConfigError as exc:
        raise FlagError(f"{source}: {exc}") from exc
    if loaded.scheduling and ns.scheduler is not None:
        raise FlagError(f"--scheduler and {source}'s scheduling profile cannot both choose the scheduler")
    notes.extend(f"{source}: {note}" for note in loaded.notes)
    return loaded.scheduler, loaded.prober


def _server_config(ns: argparse.Namespace, environ: Mapping[str, str], notes: list[str]) -> ServerConfig:
    kind = defaults.DEFAULT_SCHEDULER if ns.scheduler is None else ns.scheduler
    scheduler, prober = _picker_config(
        ns, scheduler_config(environ, ns.metrics_staleness_threshold, kind), _prober_config(ns), notes
    )
    ports: list[int] = []
    for port in ns.endpoint_target_ports:  # duplicates dropped, as upstream
        if port not in ports:
            ports.append(port)
    namespace = ns.pool_namespace or environ.get("NAMESPACE", "") or defaults.DEFAULT_POOL_NAMESPACE
    return ServerConfig(
        pool_name=ns.pool_name,
        pool_namespace=namespace,
        pool_group=ns.pool_group,
        endpoint_selector=ns.endpoint_selector,
        endpoint_target_ports=tuple(ports),
        grpc_port=ns.grpc_port,
        grpc_health_port=ns.grpc_health_port,
        metrics_port=ns.metrics_port,
        bind_address=ns.bind_address,
        metrics_bind_address=ns.metrics_bind_address,
        debug_port=ns.debug_port,
        debug_bind_address=ns.debug_bind_address,
        secure_serving=ns.secure_serving,
        cert_path=ns.cert_path,
        enable_cert_reload=bool(ns.enable_cert_reload),
        destination_endpoint_hint_key=ns.destination_endpoint_hint_key,
        destination_endpoint_hint_metadata_namespace=ns.destination_endpoint_hint_metadata_namespace,
        refresh_prometheus_metrics_interval=ns.refresh_prometheus_metrics_interval,
        kubeconfig=ns.kubeconfig,
        max_request_body_bytes=ns.max_request_body_bytes,
        ext_proc_transport=ns.ext_proc_transport,
        event_loop=ns.event_loop,
        scheduler=scheduler,
        prober=prober,
        watch=WatchConfig(bookmark_interval=ns.watch_bookmark_interval),
        shutdown_delay=ns.shutdown_delay,
        shutdown_grace_period=ns.shutdown_grace_period,
        leader_election=LeaderElectionConfig(
            enabled=bool(ns.ha_enable_leader_election), identity=environ.get("POD_NAME", "")
        ),
        destination_fallbacks=ns.destination_endpoint_fallbacks,
        endpoint_subset_filter=not ns.disable_endpoint_subset_filter,
        h2=_h2_limits(ns),
    )


# --- `--h2-*`: the ext_proc port's HTTP/2 limits (ours; README "Hardening") -----------------------
# (flag, Limits field, parser, help). Defaults are epp.h2.limits's.
_H2_FLAGS: tuple[tuple[str, str, Callable[[str], int | float], str], ...] = (
    ("--h2-max-concurrent-streams", "max_concurrent_streams", int, "Streams per connection (advertised)."),
    (
        "--h2-stream-window",
        "stream_window",
        parse_byte_size,
        "Receive window per stream (bytes, 256Ki); widened for a message longer than it.",
    ),
    (
        "--h2-connection-window",
        "connection_window",
        parse_byte_size,
        "Receive window per connection; raised to hold a largest message, 8 stream windows and a frame.",
    ),
    ("--h2-max-connections", "max_connections", int, "Connections at once; more are refused."),
    (
        "--h2-preface-timeout",
        "preface_timeout",
        _non_negative_duration,
        "TLS handshake and preface (0: off).",
    ),
    (
        "--h2-header-timeout",
        "header_timeout",
        _non_negative_duration,
        "A header block or control frame left incomplete.",
    ),
    (
        "--h2-idle-timeout",
        "idle_timeout",
        _non_negative_duration,
        "A connection with no stream; a peer that reads nothing.",
    ),
    ("--h2-max-continuation-frames", "max_continuation_frames", int, "CONTINUATION frames per header block."),
    (
        "--h2-max-queued-control-frames",
        "max_queued_control_frames",
        int,
        "Control replies queued to a peer that does not read.",
    ),
    ("--h2-max-settings-per-second", "settings_per_second", int, "SETTINGS frames a second."),
    ("--h2-max-pings-per-second", "pings_per_second", int, "PING frames a second."),
    (
        "--h2-max-resets-per-second",
        "resets_per_second",
        int,
        "RST_STREAM frames and refused streams a second.",
    ),
    (
        "--h2-max-empty-frames-per-second",
        "empty_frames_per_second",
        int,
        "Empty DATA and CONTINUATION frames a second.",
    ),
)


def _add_h2_flags(p: argparse._ArgumentGroup) -> None:
    base = Limits()
    for flag, name, convert, text in _H2_FLAGS:
        p.add_argument(
            flag, type=_typed(convert, name), default=getattr(base, name), help=text + " Not upstream."
        )


def _h2_limits(ns: argparse.Namespace) -> Limits:
    values = {name: getattr(ns, flag[2:].replace("-", "_")) for flag, name, _, _ in _H2_FLAGS}
    try:
        return Limits(**values)
    except ValueError as exc:
        flag = next((flag for flag, name, _, _ in _H2_FLAGS if str(exc).startswith(name)), "--h2-*")
        raise FlagError(f"{flag}: {exc}") from exc
