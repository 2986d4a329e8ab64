"""Command-line flags with upstream's names, and the scheduler thresholds from the environment.

This is the only place that reads argv and the environment (STYLE habit 9); everything becomes a
frozen `ServerConfig`. Like Go's `flag` package, a flag may be written with one dash or two, and as
`-name value` or `-name=value`; durations are Go duration strings (`50ms`, `5s`, `1m30s`).
`--bindAddress` is ours (not upstream): tests and the harness bind to loopback only.
`--debugPort`/`--debugBindAddress` are ours: the datastore debug view has its own listener, on
127.0.0.1 unless asked otherwise (DESIGN.md §6). `--metricsBindAddress` (ours) puts /metrics alone on
another address, e.g. loopback behind an authenticating proxy.
`--maxRequestBodyBytes` is ours too (DESIGN.md §6: a request body has a size limit), and so are
`--watchBookmarkInterval` (the watch liveness rule, DESIGN.md §6), `--shutdownDelay` and
`--shutdownGracePeriod` (the drain on SIGTERM, DESIGN.md §4).
`--extProcTransport` is ours: `h2` (our HTTP/2 server, `epp.h2`) or `grpcio` (grpc.aio, the fallback).
`--eventLoop` is ours: `auto` (uvloop when installed), `uvloop` or `asyncio` (`epp.server.event_loop`).
`--refreshPrometheusMetricsInterval` is accepted for compatibility but has nothing to drive: pool
gauges are computed at scrape time (epp.metrics.pool).

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
_SOURCES = {
    "kv_cache_threshold": "KV_CACHE_THRESHOLD",
    "queue_threshold_critical": "QUEUE_THRESHOLD_CRITICAL",
    "queueing_threshold_lora": "QUEUING_THRESHOLD_LORA",
    "lora_affinity_threshold": "LORA_AFFINITY_THRESHOLD",
    "metrics_staleness_threshold": "--metricsStalenessThreshold",
    "refresh_interval": "--refreshMetricsInterval",
    "refresh_prometheus_metrics_interval": "--refreshPrometheusMetricsInterval",
    "max_request_body_bytes": "--maxRequestBodyBytes",
    "watch_bookmark_interval": "--watchBookmarkInterval",
    "shutdown_delay": "--shutdownDelay",
    "shutdown_grace_period": "--shutdownGracePeriod",
}


@dataclass(frozen=True, slots=True)
class Flags:
    config: ServerConfig
    verbosity: int = DEFAULT_VERBOSITY
    # `--zap-log-level` (or `--zap-devel`), which wins over `-v`; None when not given.
    level_override: int | None = None
    log_encoder: str = "console"

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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise FlagError(message)


def _parser() -> _Parser:
    p = _Parser(prog="epp", description="Endpoint picker for LLM inference (ext_proc).", allow_abbrev=False)
    duration, port, go_bool = (
        _typed(_positive_duration, "duration"),
        _typed(_port, "port"),
        _typed(_go_bool, "bool"),
    )
    p.add_argument("--poolName", required=True, help="Name of the InferencePool this EPP serves (required).")
    p.add_argument("--poolNamespace", default=defaults.DEFAULT_POOL_NAMESPACE)
    p.add_argument("--grpcPort", type=port, default=defaults.DEFAULT_GRPC_PORT, help="ext_proc port.")
    p.add_argument("--grpcHealthPort", type=port, default=defaults.DEFAULT_GRPC_HEALTH_PORT)
    p.add_argument("--metricsPort", type=port, default=defaults.DEFAULT_METRICS_PORT)
    p.add_argument(
        "--bindAddress",
        default="0.0.0.0",
        help="Address ext_proc, health and /metrics bind to (not upstream).",
    )
    p.add_argument(
        "--debugPort", type=port, default=defaults.DEFAULT_DEBUG_PORT, help="/debug/datastore port."
    )
    p.add_argument(
        "--metricsBindAddress",
        default="",
        help="Address of /metrics alone; empty: --bindAddress (not upstream).",
    )
    p.add_argument(
        "--debugBindAddress",
        default=defaults.DEFAULT_DEBUG_BIND_ADDRESS,
        help="Address of /debug/datastore; loopback unless you mean to expose it (not upstream).",
    )
    p.add_argument(
        "--refreshMetricsInterval", type=duration, default=defaults.DEFAULT_REFRESH_METRICS_INTERVAL
    )
    p.add_argument(
        "--refreshPrometheusMetricsInterval",
        type=duration,
        default=defaults.DEFAULT_REFRESH_PROMETHEUS_METRICS_INTERVAL,
        help="Accepted for compatibility; pool gauges are computed at scrape time.",
    )
    p.add_argument(
        "--metricsStalenessThreshold", type=duration, default=defaults.DEFAULT_METRICS_STALENESS_THRESHOLD
    )
    p.add_argument("--secureServing", type=go_bool, nargs="?", const=True, default=True)
    # Upstream's HA mode (epp.k8s.leader): only the Lease holder reports SERVING. Identity: $POD_NAME.
    p.add_argument(
        "--ha-enable-leader-election", dest="ha_enable_leader_election", type=go_bool, nargs="?", const=True,
        default=False,
    )  # fmt: skip
    p.add_argument("--certPath", default="", help="Directory with tls.crt and tls.key; empty: self-signed.")
    p.add_argument("--destinationEndpointHintKey", default=defaults.DEFAULT_DESTINATION_ENDPOINT_HINT_KEY)
    p.add_argument(
        "--DestinationEndpointHintMetadataNamespace",
        default=defaults.DEFAULT_DESTINATION_ENDPOINT_HINT_METADATA_NAMESPACE,
    )
    p.add_argument(
        "--scheduler",
        choices=defaults.SCHEDULERS,
        default=defaults.DEFAULT_SCHEDULER,
        help="Not upstream: the v0.3.0 filter tree, or weighted scorers (queue, KV, LoRA affinity, "
        "prefix, the EPP's own in-flight count; weights from QUEUE_SCORE_WEIGHT, KV_CACHE_SCORE_WEIGHT, "
        "LORA_AFFINITY_SCORE_WEIGHT, PREFIX_CACHE_SCORE_WEIGHT, IN_FLIGHT_SCORE_WEIGHT).",
    )
    p.add_argument("--totalQueuedRequestsMetric", default=defaults.DEFAULT_QUEUED_REQUESTS_METRIC)
    p.add_argument("--kvCacheUsagePercentageMetric", default=defaults.DEFAULT_KV_CACHE_USAGE_METRIC)
    p.add_argument("--loraInfoMetric", default=defaults.DEFAULT_LORA_INFO_METRIC)
    p.add_argument(
        "--v", type=_typed(int, "int"), default=DEFAULT_VERBOSITY, help="Log verbosity (4: debug)."
    )
    p.add_argument(
        "--kubeconfig", default="", help="Kubeconfig path; empty: $KUBECONFIG, in-cluster, ~/.kube."
    )
    p.add_argument(
        "--maxRequestBodyBytes",
        type=_typed(parse_byte_size, "size"),
        default=defaults.DEFAULT_MAX_REQUEST_BODY_BYTES,
        help="Largest request body accepted (413 above it); bytes or 512Ki/16Mi/1Gi (not upstream).",
    )
    wait = _typed(_non_negative_duration, "duration")
    p.add_argument(
        "--watchBookmarkInterval",
        type=duration,
        default=defaults.DEFAULT_WATCH_BOOKMARK_INTERVAL,
        help="Each watch of the API ends after this long (+0..25%%) and one that reads nothing for "
        "twice this long is replaced as dead (not upstream).",
    )
    p.add_argument(
        "--shutdownDelay",
        type=wait,
        default=defaults.DEFAULT_SHUTDOWN_DELAY,
        help="On SIGTERM, health says NOT_SERVING and ext_proc keeps serving this long, so load "
        "balancers stop sending streams (not upstream).",
    )
    p.add_argument(
        "--shutdownGracePeriod",
        type=wait,
        default=defaults.DEFAULT_SHUTDOWN_GRACE_PERIOD,
        help="Then new streams are refused and those in flight get this long to finish (not upstream).",
    )
    p.add_argument(
        "--extProcTransport",
        choices=defaults.EXT_PROC_TRANSPORTS,
        default=defaults.DEFAULT_EXT_PROC_TRANSPORT,
        help="How the ext_proc port serves gRPC: h2 (ours, on asyncio) or grpcio (grpc.aio); not upstream.",
    )
    p.add_argument(
        "--eventLoop",
        choices=defaults.EVENT_LOOPS,
        default=defaults.AUTO_EVENT_LOOP,
        help="The event loop: auto (uvloop if installed, else asyncio's), uvloop or asyncio; not upstream.",
    )
    # controller-runtime's zap flags, as upstream's manifests pass them (see the module docstring).
    p.add_argument(
        "--zap-log-level", dest="zap_log_level", type=_typed(_zap_level, "zap level"), default=None
    )
    p.add_argument("--zap-encoder", dest="zap_encoder", type=_typed(_choice(*LOG_ENCODERS), "encoder"))
    p.add_argument("--zap-devel", dest="zap_devel", type=go_bool, nargs="?", const=True, default=False)
    p.add_argument(
        "--zap-stacktrace-level", dest="zap_stacktrace_level", type=_typed(_zap_level, "zap level")
    )
    p.add_argument(
        "--zap-time-encoding",
        dest="zap_time_encoding",
        type=_typed(_choice(*_ZAP_TIME_ENCODINGS), "encoding"),
    )
    _add_h2_flags(p)
    return p


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
    """argv (without the program name) and the environment → settings; raises FlagError."""
    ns = _parser().parse_args(go_style(argv))
    if not ns.poolName:
        raise FlagError("--poolName must not be empty")
    if ns.refreshMetricsInterval > ns.metricsStalenessThreshold:
        raise FlagError(
            f"--refreshMetricsInterval ({ns.refreshMetricsInterval}s) must not be longer than "
            f"--metricsStalenessThreshold ({ns.metricsStalenessThreshold}s): every pod would look stale"
        )
    try:
        config = _server_config(ns, environ)
    except ConfigError as exc:
        source = _SOURCES.get(exc.setting, exc.setting)
        raise FlagError(f"{source}={exc.value!r}: {exc.rule}") from exc
    level = ns.zap_log_level
    if level is None and ns.zap_devel:
        level = logging.DEBUG  # controller-runtime's development mode logs at debug
    return Flags(config=config, verbosity=ns.v, level_override=level, log_encoder=ns.zap_encoder or "console")


def _server_config(ns: argparse.Namespace, environ: Mapping[str, str]) -> ServerConfig:
    kv_metric = ns.kvCacheUsagePercentageMetric
    names = MetricNames(
        queued_requests=ns.totalQueuedRequestsMetric,
        kv_cache_usage=kv_metric,
        # The vLLM fallback only makes sense for the vLLM default; a custom name stands alone.
        kv_cache_usage_fallback=(
            defaults.FALLBACK_KV_CACHE_USAGE_METRIC
            if kv_metric == defaults.DEFAULT_KV_CACHE_USAGE_METRIC
            else ""
        ),
        lora_info=ns.loraInfoMetric,
    )
    return ServerConfig(
        pool_name=ns.poolName,
        pool_namespace=ns.poolNamespace,
        grpc_port=ns.grpcPort,
        grpc_health_port=ns.grpcHealthPort,
        metrics_port=ns.metricsPort,
        bind_address=ns.bindAddress,
        metrics_bind_address=ns.metricsBindAddress,
        debug_port=ns.debugPort,
        debug_bind_address=ns.debugBindAddress,
        secure_serving=ns.secureServing,
        cert_path=ns.certPath,
        destination_endpoint_hint_key=ns.destinationEndpointHintKey,
        destination_endpoint_hint_metadata_namespace=ns.DestinationEndpointHintMetadataNamespace,
        refresh_prometheus_metrics_interval=ns.refreshPrometheusMetricsInterval,
        kubeconfig=ns.kubeconfig,
        max_request_body_bytes=ns.maxRequestBodyBytes,
        ext_proc_transport=ns.extProcTransport,
        event_loop=ns.eventLoop,
        scheduler=scheduler_config(environ, ns.metricsStalenessThreshold, ns.scheduler),
        prober=ProberConfig(refresh_interval=ns.refreshMetricsInterval, metric_names=names),
        watch=WatchConfig(bookmark_interval=ns.watchBookmarkInterval),
        shutdown_delay=ns.shutdownDelay,
        shutdown_grace_period=ns.shutdownGracePeriod,
        leader_election=LeaderElectionConfig(
            enabled=ns.ha_enable_leader_election, identity=environ.get("POD_NAME", "")
        ),
        h2=_h2_limits(ns),
    )


# --- `--h2-*`: the ext_proc port's HTTP/2 limits (ours; README "Hardening") -----------------------
# (flag, Limits field, parser, help). Defaults are epp.h2.limits's.
_H2_FLAGS: tuple[tuple[str, str, Callable[[str], int | float], str], ...] = (
    ("--h2-max-concurrent-streams", "max_concurrent_streams", int, "Streams per connection (advertised)."),
    ("--h2-stream-window", "stream_window", parse_byte_size, "Receive window per stream (bytes, 1Mi)."),
    (
        "--h2-connection-window",
        "connection_window",
        parse_byte_size,
        "Receive window per connection; raised to hold two largest messages.",
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


def _add_h2_flags(p: argparse.ArgumentParser) -> None:
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
