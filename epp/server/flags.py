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
    ConformanceHooks,
    LeaderElectionConfig,
    MetricNames,
    ProberConfig,
    SchedulerConfig,
    ScorerWeights,
    ServerConfig,
    WatchConfig,
)
from epp.pickerconfig import PickerConfigError, load_picker_config
from epp.server.flag_values import (
    DEBUG_VERBOSITY,
    DEFAULT_VERBOSITY,
    LOG_ENCODERS,
    ZAP_TIME_ENCODINGS,
    FlagError,
    choice,
    go_bool,
    label_selector,
    non_negative_duration,
    parse_byte_size,
    port_list,
    port_number,
    positive_duration,
    typed,
    zap_level,
)
from epp.server.h2_flags import add_h2_flags, h2_limits

T = TypeVar("T")

log = logging.getLogger(__name__)

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
    duration, port, boolean = (
        typed(positive_duration, "duration"),
        typed(port_number, "port"),
        typed(go_bool, "bool"),
    )

    up = p.add_argument_group("upstream v1.5.0 flags")

    def flag_bool(*names: str, default: bool | None, help: str) -> None:
        up.add_argument(
            *names, type=boolean, nargs="?", const=True, default=default, metavar="BOOL", help=help
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
        type=typed(choice(*defaults.POOL_GROUPS), "group"),
        default=defaults.DEFAULT_POOL_GROUP,
        help=f"API group of the pool: {defaults.V1_POOL_GROUP} (v1) or {defaults.V1ALPHA2_POOL_GROUP} "
        "(v1alpha2, with InferenceModels).",
    )
    up.add_argument(
        "--endpoint-selector",
        type=typed(label_selector, "selector"),
        default=(),
        help="Standalone mode, instead of --pool-name: pods with these labels (key=value,key2=value2).",
    )
    up.add_argument(
        "--endpoint-target-ports",
        type=typed(port_list, "ports"),
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
        type=typed(choice(*defaults.METRICS_SCHEMES), "scheme"),
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
        "--v", type=typed(int, "int"), default=DEFAULT_VERBOSITY, help="Log verbosity, also -v (4: debug)."
    )
    # controller-runtime's zap flags, as upstream's manifests pass them (see the module docstring).
    up.add_argument(
        "--zap-log-level", type=typed(zap_level, "zap level"), default=None, help="debug, info, error or N."
    )
    up.add_argument("--zap-encoder", type=typed(choice(*LOG_ENCODERS), "encoder"), help="json or console.")
    up.add_argument(
        "--zap-devel", type=boolean, nargs="?", const=True, default=False, metavar="BOOL", help="Debug level."
    )
    up.add_argument(
        "--zap-stacktrace-level", type=typed(zap_level, "zap level"), help="Accepted, changes nothing."
    )
    up.add_argument(
        "--zap-time-encoding",
        type=typed(choice(*ZAP_TIME_ENCODINGS), "encoding"),
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
        "in-flight count, predicted TTFT; weights from QUEUE_SCORE_WEIGHT, KV_CACHE_SCORE_WEIGHT, "
        "LORA_AFFINITY_SCORE_WEIGHT, PREFIX_CACHE_SCORE_WEIGHT, IN_FLIGHT_SCORE_WEIGHT, "
        "LAST_ROUTED_SCORE_WEIGHT, PREDICTED_TTFT_SCORE_WEIGHT); default scorer. "
        "A config file's profile replaces it.",
    )
    ours.add_argument(
        "--max-request-body-bytes",
        "--maxRequestBodyBytes",
        type=typed(parse_byte_size, "size"),
        default=defaults.DEFAULT_MAX_REQUEST_BODY_BYTES,
        help="Largest request body accepted (413 above it); bytes or 512Ki/16Mi/1Gi.",
    )
    wait = typed(non_negative_duration, "duration")
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
    add_h2_flags(ours)
    return p


def _request_protocol_flags(ours: argparse._ArgumentGroup) -> None:
    """Our knob of the v1 request protocol (epp.handlers); upstream's subset switch is with its flags."""
    ours.add_argument(
        "--destination-endpoint-fallbacks",
        dest="destination_endpoint_fallbacks",
        type=typed(int, "int"),
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
        last_routed=weight("LAST_ROUTED_SCORE_WEIGHT", base.last_routed),
        predicted_ttft=weight("PREDICTED_TTFT_SCORE_WEIGHT", base.predicted_ttft),
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
) -> tuple[SchedulerConfig, ProberConfig, ConformanceHooks]:
    """Apply `--config-file` / `--config-text`, if any: the file's settings win over flags and env;
    the test plugins it names, if any."""
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
        return scheduler, prober, ConformanceHooks()
    try:
        loaded = load_picker_config(text, scheduler=scheduler, prober=prober)
    except PickerConfigError as exc:
        raise FlagError(f"{source}: {exc}") from exc
    if loaded.scheduling and ns.scheduler is not None:
        raise FlagError(f"--scheduler and {source}'s scheduling profile cannot both choose the scheduler")
    notes.extend(f"{source}: {note}" for note in loaded.notes)
    return loaded.scheduler, loaded.prober, loaded.conformance


def _server_config(ns: argparse.Namespace, environ: Mapping[str, str], notes: list[str]) -> ServerConfig:
    kind = defaults.DEFAULT_SCHEDULER if ns.scheduler is None else ns.scheduler
    scheduler, prober, conformance = _picker_config(
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
        conformance=conformance,
        h2=h2_limits(ns),
    )


# --- `--h2-*`: the ext_proc port's HTTP/2 limits (ours; README "Hardening") -----------------------
# (flag, Limits field, parser, help). Defaults are epp.h2.limits's.
