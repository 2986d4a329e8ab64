"""Flags as upstream names them, Go-style dashes and durations, env thresholds with fallback."""

from __future__ import annotations

import logging

import pytest

from epp import config as defaults
from epp.config import SchedulerConfig
from epp.server.flag_values import FlagError, parse_go_duration
from epp.server.flags import go_style, parse_flags


def test_defaults_match_upstream() -> None:
    flags = parse_flags(["--poolName", "p"], {})
    c = flags.config
    assert (c.pool_name, c.pool_namespace) == ("p", "default")
    assert (c.grpc_port, c.grpc_health_port, c.metrics_port) == (9002, 9003, 9090)
    assert c.secure_serving is True
    assert c.cert_path == ""
    assert c.destination_endpoint_hint_key == "x-gateway-destination-endpoint"
    assert c.destination_endpoint_hint_metadata_namespace == "envoy.lb"
    assert c.prober.refresh_interval == 0.05
    assert c.refresh_prometheus_metrics_interval == 5.0
    assert c.scheduler.metrics_staleness_threshold == 2.0
    assert c.prober.metric_names.queued_requests == "vllm:num_requests_waiting"
    assert c.prober.metric_names.kv_cache_usage == "vllm:kv_cache_usage_perc"
    assert c.prober.metric_names.kv_cache_usage_fallback == "vllm:gpu_cache_usage_perc"
    assert c.prober.metric_names.lora_info == "vllm:lora_requests_info"
    assert flags.verbosity == 2
    assert flags.log_level == logging.INFO


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param([], id="absent"),
        pytest.param(["--poolName="], id="empty"),
        pytest.param(["--poolNamespace", "ns"], id="only-namespace"),
    ],
)
def test_pool_name_is_required(argv: list[str]) -> None:
    with pytest.raises(FlagError, match="poolName"):
        parse_flags(argv, {})


def test_single_and_double_dash_and_equals_forms() -> None:
    argv = [
        "-poolName=p", "--poolNamespace", "ns", "-grpcPort", "0", "--grpcHealthPort=0", "-metricsPort=0",
        "-refreshMetricsInterval", "100ms", "--refreshPrometheusMetricsInterval=1m",
        "-metricsStalenessThreshold=1.5s", "-secureServing=false", "-certPath", "/certs",
        "-destinationEndpointHintKey=x-dest", "-DestinationEndpointHintMetadataNamespace=",
        "-totalQueuedRequestsMetric=q", "-kvCacheUsagePercentageMetric=kv", "-loraInfoMetric=lora",
        "-v", "4", "-kubeconfig=/kc", "-bindAddress=127.0.0.1",
    ]  # fmt: skip
    flags = parse_flags(argv, {})
    c = flags.config
    assert (c.pool_name, c.pool_namespace, c.grpc_port, c.grpc_health_port, c.metrics_port) == (
        "p",
        "ns",
        0,
        0,
        0,
    )
    assert c.prober.refresh_interval == pytest.approx(0.1)
    assert c.refresh_prometheus_metrics_interval == 60
    assert c.scheduler.metrics_staleness_threshold == 1.5
    assert (c.secure_serving, c.cert_path, c.kubeconfig, c.bind_address) == (
        False,
        "/certs",
        "/kc",
        "127.0.0.1",
    )
    assert (c.destination_endpoint_hint_key, c.destination_endpoint_hint_metadata_namespace) == ("x-dest", "")
    names = c.prober.metric_names
    assert (names.queued_requests, names.kv_cache_usage, names.lora_info) == ("q", "kv", "lora")
    assert names.kv_cache_usage_fallback == ""  # the vLLM fallback only backs the vLLM default
    assert flags.verbosity == 4
    assert flags.log_level == logging.DEBUG


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["-secureServing"], True, id="bare"),
        pytest.param(["-secureServing=true"], True, id="true"),
        pytest.param(["--secureServing=0"], False, id="zero"),
        pytest.param(["--secureServing=F"], False, id="F"),
    ],
)
def test_bool_flag_forms(argv: list[str], expected: bool) -> None:
    assert parse_flags(["-poolName", "p", *argv], {}).config.secure_serving is expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("50ms", 0.05, id="ms"),
        pytest.param("5s", 5.0, id="s"),
        pytest.param("1.5s", 1.5, id="fraction"),
        pytest.param("1m30s", 90.0, id="compound"),
        pytest.param("2h", 7200.0, id="hours"),
        pytest.param("300us", 0.0003, id="us"),
        pytest.param("300µs", 0.0003, id="micro-sign"),
        pytest.param("10ns", 1e-8, id="ns"),
        pytest.param(".5s", 0.5, id="leading-dot"),
        pytest.param("0", 0.0, id="bare-zero"),
        pytest.param("-1s", -1.0, id="negative"),
    ],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "5 s", "s", "1d", "1.2.3s", "ms5", "--1s"])
def test_bad_go_durations(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["-refreshMetricsInterval", "fast"], id="not-a-duration"),
        pytest.param(["-refreshMetricsInterval", "0"], id="zero-interval"),
        pytest.param(["-metricsStalenessThreshold=-2s"], id="negative"),
        pytest.param(["-grpcPort", "70000"], id="port-range"),
        pytest.param(["-grpcPort", "x"], id="port-type"),
        pytest.param(["-secureServing=maybe"], id="bool"),
        pytest.param(["-unknownFlag", "1"], id="unknown"),
        pytest.param(["-poolNam", "p"], id="no-abbreviations"),
    ],
)
def test_bad_values_are_flag_errors(argv: list[str]) -> None:
    with pytest.raises(FlagError):
        parse_flags(["-poolName", "p", *argv], {})


def test_go_style_leaves_values_and_rest_alone() -> None:
    assert go_style(["-v", "-3", "-x=-y", "--", "-z"]) == ["--v", "-3", "--x=-y", "--", "-z"]


def test_env_thresholds() -> None:
    env = {
        "KV_CACHE_THRESHOLD": "0.5",
        "QUEUE_THRESHOLD_CRITICAL": "9",
        "QUEUING_THRESHOLD_LORA": "64",
        "LORA_AFFINITY_THRESHOLD": "0.9",
    }
    s = parse_flags(["-poolName", "p"], env).config.scheduler
    assert s.kv_cache_threshold == 0.5
    assert s.queue_threshold_critical == 9
    assert s.queueing_threshold_lora == 64
    assert s.lora_affinity_threshold == 0.9


def test_bad_env_threshold_falls_back_to_default_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    env = {"KV_CACHE_THRESHOLD": "lots", "QUEUE_THRESHOLD_CRITICAL": "2.5", "QUEUING_THRESHOLD_LORA": ""}
    with caplog.at_level(logging.WARNING, logger="epp.server.flags"):
        s = parse_flags(["-poolName", "p"], env).config.scheduler
    assert s.kv_cache_threshold == defaults.DEFAULT_KV_CACHE_THRESHOLD
    assert s.queue_threshold_critical == defaults.DEFAULT_QUEUE_THRESHOLD_CRITICAL
    assert s.queueing_threshold_lora == defaults.DEFAULT_QUEUEING_THRESHOLD_LORA
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "KV_CACHE_THRESHOLD" in messages
    assert "QUEUE_THRESHOLD_CRITICAL" in messages


# --- settings that cannot work are a startup error (issue 12) --------------------------------------
@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        pytest.param([], {"KV_CACHE_THRESHOLD": "nan"}, "KV_CACHE_THRESHOLD", id="kv-threshold-nan"),
        pytest.param([], {"KV_CACHE_THRESHOLD": "-0.1"}, "KV_CACHE_THRESHOLD", id="kv-threshold-negative"),
        pytest.param([], {"KV_CACHE_THRESHOLD": "1.5"}, "KV_CACHE_THRESHOLD", id="kv-threshold-above-one"),
        pytest.param(
            [], {"LORA_AFFINITY_THRESHOLD": "inf"}, "LORA_AFFINITY_THRESHOLD", id="lora-affinity-inf"
        ),
        pytest.param([], {"QUEUE_THRESHOLD_CRITICAL": "-1"}, "QUEUE_THRESHOLD_CRITICAL", id="queue-negative"),
        pytest.param(
            [], {"QUEUING_THRESHOLD_LORA": "-5"}, "QUEUING_THRESHOLD_LORA", id="lora-queue-negative"
        ),
        pytest.param(
            ["-refreshMetricsInterval=5s"], {}, "--refreshMetricsInterval", id="refresh-longer-than-staleness"
        ),
        pytest.param(
            ["-metricsStalenessThreshold=10ms"],
            {},
            "--metricsStalenessThreshold",
            id="staleness-shorter-than-refresh",
        ),
        pytest.param(["-maxRequestBodyBytes=0"], {}, "--maxRequestBodyBytes", id="no-body-allowed"),
        pytest.param(["-watchBookmarkInterval=500ms"], {}, "--watchBookmarkInterval", id="watch-under-1s"),
        pytest.param(["-watchBookmarkInterval=0"], {}, "watchBookmarkInterval", id="watch-zero"),
        pytest.param(["-shutdownDelay=-1s"], {}, "shutdownDelay", id="negative-delay"),
        pytest.param(["-shutdownGracePeriod=soon"], {}, "shutdownGracePeriod", id="grace-not-a-duration"),
    ],
)
def test_settings_that_cannot_work_are_a_clear_startup_error(
    argv: list[str], env: dict[str, str], named: str
) -> None:
    with pytest.raises(FlagError) as info:
        parse_flags(["-poolName", "p", *argv], env)
    assert named in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"kv_cache_threshold": float("nan")}, id="nan"),
        pytest.param({"queue_threshold_critical": -1}, id="negative-queue"),
        pytest.param({"metrics_staleness_threshold": 0.0}, id="zero-staleness"),
        pytest.param({"lora_affinity_threshold": 1.01}, id="probability-above-one"),
    ],
)
def test_settings_objects_refuse_meaningless_values(changes: dict[str, float]) -> None:
    """Whoever builds the settings (flags, the harness, a test) gets the same checks."""
    with pytest.raises(ValueError, match=next(iter(changes))):
        SchedulerConfig(**changes)  # type: ignore[arg-type]


def test_the_refresh_interval_may_equal_the_staleness_threshold() -> None:
    config = parse_flags(["-poolName", "p", "-refreshMetricsInterval=2s"], {}).config
    assert config.prober.refresh_interval == config.scheduler.metrics_staleness_threshold == 2.0


def test_watch_liveness_and_drain_flags() -> None:
    default = parse_flags(["-poolName", "p"], {}).config
    assert default.watch.bookmark_interval == defaults.DEFAULT_WATCH_BOOKMARK_INTERVAL == 60.0
    assert (default.shutdown_delay, default.shutdown_grace_period) == (5.0, 120.0)

    argv = ["-poolName", "p", "--watchBookmarkInterval=2s", "-shutdownDelay=0s", "-shutdownGracePeriod=1m"]
    config = parse_flags(argv, {}).config
    assert config.watch.bookmark_interval == 2.0
    assert (config.shutdown_delay, config.shutdown_grace_period) == (0.0, 60.0)


def test_request_body_limit_flag_sets_the_grpc_limit_too() -> None:
    config = parse_flags(["-poolName", "p", "--maxRequestBodyBytes=1048576"], {}).config
    assert config.max_request_body_bytes == 1024 * 1024
    assert config.grpc_max_message_bytes > config.max_request_body_bytes
    default = parse_flags(["-poolName", "p"], {}).config
    assert default.max_request_body_bytes == defaults.DEFAULT_MAX_REQUEST_BODY_BYTES == 16 * 1024 * 1024


# --- upstream manifests pass zap's logging flags -----------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "level", "encoder"),
    [
        pytest.param(["--zap-encoder", "json"], logging.INFO, "json", id="encoder-json"),
        pytest.param(["--zap-encoder=console"], logging.INFO, "console", id="encoder-console"),
        pytest.param(["--zap-log-level", "debug"], logging.DEBUG, "console", id="level-debug"),
        pytest.param(["--zap-log-level=error"], logging.ERROR, "console", id="level-error"),
        pytest.param(["-v", "4", "--zap-log-level=info"], logging.INFO, "console", id="level-overrides-v"),
        pytest.param(["--zap-log-level=4"], logging.DEBUG, "console", id="level-as-verbosity"),
        pytest.param(["--zap-devel"], logging.DEBUG, "console", id="devel-is-debug"),
        pytest.param(["--zap-devel=false"], logging.INFO, "console", id="devel-off"),
        pytest.param(["--zap-devel", "--zap-encoder", "json"], logging.DEBUG, "json", id="devel-with-json"),
        pytest.param(
            ["--zap-stacktrace-level=panic", "--zap-time-encoding", "iso8601"],
            logging.INFO,
            "console",
            id="accepted-and-ignored",
        ),
    ],
)
def test_zap_logging_flags_are_accepted(argv: list[str], level: int, encoder: str) -> None:
    flags = parse_flags(["-poolName", "p", *argv], {})
    assert (flags.log_level, flags.log_encoder) == (level, encoder)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--zap-encoder", "xml"], id="unknown-encoder"),
        pytest.param(["--zap-log-level", "loud"], id="unknown-level"),
        pytest.param(["--zap-time-encoding", "sundial"], id="unknown-time-encoding"),
    ],
)
def test_bad_zap_values_are_flag_errors(argv: list[str]) -> None:
    with pytest.raises(FlagError):
        parse_flags(["-poolName", "p", *argv], {})


def test_scheduler_flag_and_scorer_weights_from_the_environment() -> None:
    assert parse_flags(["-poolName", "p"], {}).config.scheduler.kind == defaults.DEFAULT_SCHEDULER
    env = {
        "QUEUE_SCORE_WEIGHT": "0",
        "KV_CACHE_SCORE_WEIGHT": "0.5",
        "PREFIX_CACHE_SCORE_WEIGHT": "4",
        "LORA_AFFINITY_SCORE_WEIGHT": "2",
        "IN_FLIGHT_SCORE_WEIGHT": "1.5",
        "LAST_ROUTED_SCORE_WEIGHT": "1",
        "PREDICTED_TTFT_SCORE_WEIGHT": "0",
    }
    s = parse_flags(["-poolName", "p", "--scheduler=scorer"], env).config.scheduler
    assert s.kind == "scorer"
    assert s.weights == defaults.ScorerWeights(
        queue=0, kv_cache=0.5, prefix=4, lora=2, in_flight=1.5, last_routed=1, predicted_ttft=0
    )
    assert s.prefix_aware
    assert not parse_flags(
        ["-poolName", "p", "--scheduler=scorer"], {"PREFIX_CACHE_SCORE_WEIGHT": "0"}
    ).config.scheduler.prefix_aware
    assert not parse_flags(["-poolName", "p", "--scheduler=filter-tree"], {}).config.scheduler.prefix_aware


def test_bad_scorer_weights_fall_back_to_defaults(caplog: pytest.LogCaptureFixture) -> None:
    env = {"QUEUE_SCORE_WEIGHT": "-1", "LORA_AFFINITY_SCORE_WEIGHT": "heavy"}
    with caplog.at_level(logging.WARNING, logger="epp.server.flags"):
        weights = parse_flags(["-poolName", "p"], env).config.scheduler.weights
    assert (weights.queue, weights.lora) == (defaults.ScorerWeights().queue, defaults.ScorerWeights().lora)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "QUEUE_SCORE_WEIGHT" in messages
    assert "LORA_AFFINITY_SCORE_WEIGHT" in messages


def test_unknown_scheduler_is_a_flag_error() -> None:
    with pytest.raises(FlagError):
        parse_flags(["-poolName", "p", "--scheduler=magic"], {})


@pytest.mark.parametrize(
    ("argv", "enabled"),
    [
        pytest.param([], False, id="off-by-default-active-active"),
        pytest.param(["--ha-enable-leader-election"], True, id="bare"),
        pytest.param(["--ha-enable-leader-election=false"], False, id="explicit-false"),
    ],
)
def test_leader_election_flag_and_pod_name_identity(argv: list[str], enabled: bool) -> None:
    config = parse_flags(["--poolName", "p", *argv], {"POD_NAME": "epp-0"}).config
    assert (config.leader_election.enabled, config.leader_election.identity) == (enabled, "epp-0")
