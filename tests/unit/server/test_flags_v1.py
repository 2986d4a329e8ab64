"""Upstream v1.5.0's flag names (primary), v0.3.0's (aliases), refused and accepted-as-no-op flags,
and the exact argument lists upstream's inferencepool chart passes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from epp import config as defaults
from epp.api.types import V1_GROUP, V1ALPHA2_GROUP
from epp.server.flag_values import FlagError
from epp.server.flags import NO_OP_FLAGS, REFUSED_METRIC_FLAGS, _parser, parse_flags

# What upstream v1.5.0's chart (config/charts/epplib/templates/_config.yaml, default values) writes
# to the EPP's default-plugins.yaml.
CHART_DEFAULT_PLUGINS = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
  parameters:
    scheme: "http"
    path: "/metrics"
    insecureSkipVerify: true
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""
CHART_CONFIG_PATH = "/config/default-plugins.yaml"


def chart_args(*, replicas: int = 1, tracing: bool = False, metrics_auth: bool = True) -> list[str]:
    """The epp container's args from upstream v1.5.0's chart (config/charts/epplib/templates/
    _deployment.yaml) for release `vllm-llama3-8b-instruct` in namespace `default`, values as
    shipped (modelServerType vllm, flags {v: 1}) unless changed here; the YAML quotes are gone."""
    args = [
        "--pool-name", "vllm-llama3-8b-instruct",
        "--pool-namespace", "default",
        "--pool-group", V1_GROUP,
        "--zap-encoder", "json",
        "--config-file", CHART_CONFIG_PATH,
    ]  # fmt: skip
    if replicas > 1:
        args.append("--ha-enable-leader-election")
    args += ["--v", "1"]
    args.append("--tracing=true" if tracing else "--tracing=false")
    if not metrics_auth:
        args.append("--metrics-endpoint-auth=false")
    return args


def _with_config_file(args: list[str], tmp_path: Path) -> list[str]:
    """The same list with the chart's ConfigMap mount replaced by a file holding what it holds."""
    path = tmp_path / "default-plugins.yaml"
    path.write_text(CHART_DEFAULT_PLUGINS)
    return [str(path) if a == CHART_CONFIG_PATH else a for a in args]


def test_the_chart_default_arguments_start_the_epp(tmp_path: Path) -> None:
    args = chart_args()
    assert args[args.index("--config-file") + 1] == CHART_CONFIG_PATH
    flags = parse_flags(_with_config_file(args, tmp_path), {"NAMESPACE": "default", "POD_NAME": "epp-0"})
    c = flags.config
    assert (c.pool_name, c.pool_namespace, c.pool_group) == (
        "vllm-llama3-8b-instruct",
        "default",
        defaults.V1_POOL_GROUP,
    )
    assert c.api_v1
    assert not c.standalone
    assert (c.grpc_port, c.grpc_health_port, c.metrics_port) == (9002, 9003, 9090)
    assert flags.log_encoder == "json"
    assert flags.verbosity == 1
    # The chart's profile: queue 2, KV 2, prefix 3, highest total wins.
    profile = c.scheduler.scoring_profile
    assert c.scheduler.kind == defaults.SCORER
    assert [(s.kind, s.weight) for s in profile.scorers] == [
        ("queue", 2.0),
        ("kv_cache", 2.0),
        ("prefix", 3.0),
    ]
    assert profile.picker == defaults.MAX_SCORE_PICKER
    assert c.scheduler.prefix_aware
    assert flags.notes == ()  # --tracing=false asks for nothing


@pytest.mark.parametrize(
    ("changes", "flag", "noted"),
    [
        pytest.param({"replicas": 2}, "leader_election.enabled", "", id="replicas-2-leader-election"),
        pytest.param({"tracing": True}, "", "--tracing", id="tracing-on"),
        pytest.param({"metrics_auth": False}, "", "", id="metrics-auth-off"),
    ],
)
def test_the_chart_argument_variants_start_the_epp(
    tmp_path: Path, changes: dict[str, object], flag: str, noted: str
) -> None:
    flags = parse_flags(_with_config_file(chart_args(**changes), tmp_path), {})  # type: ignore[arg-type]
    assert flags.config.pool_name == "vllm-llama3-8b-instruct"
    if flag:
        section, _, field = flag.rpartition(".")
        assert getattr(getattr(flags.config, section) if section else flags.config, field) is True
    if noted:
        assert any(note.startswith(noted) for note in flags.notes), flags.notes
    else:
        assert flags.notes == ()


def test_the_chart_standalone_arguments_start_the_epp() -> None:
    """The chart's endpointsServer mode (no InferencePool): selector and ports instead of a pool."""
    argv = [
        "--endpoint-selector", "app=vllm-llama3-8b-instruct",
        "--endpoint-target-ports", "8000",
        "--zap-encoder", "json", "--config-text", CHART_DEFAULT_PLUGINS, "--v", "1", "--tracing=false",
    ]  # fmt: skip
    c = parse_flags(argv, {}).config
    assert c.standalone
    assert c.pool_name == ""
    assert c.endpoint_selector == (("app", "vllm-llama3-8b-instruct"),)
    assert c.endpoint_target_ports == (8000,)


@pytest.mark.parametrize(
    ("primary", "alias", "value", "field", "expected"),
    [
        pytest.param("--pool-name", "--poolName", "p", "pool_name", "p", id="pool-name"),
        pytest.param(
            "--pool-namespace", "--poolNamespace", "ns", "pool_namespace", "ns", id="pool-namespace"
        ),
        pytest.param("--grpc-port", "--grpcPort", "0", "grpc_port", 0, id="grpc-port"),
        pytest.param("--grpc-health-port", "--grpcHealthPort", "7", "grpc_health_port", 7, id="health-port"),
        pytest.param("--metrics-port", "--metricsPort", "8", "metrics_port", 8, id="metrics-port"),
        pytest.param("--cert-path", "--certPath", "/c", "cert_path", "/c", id="cert-path"),
        pytest.param(
            "--secure-serving", "--secureServing", "false", "secure_serving", False, id="secure-serving"
        ),
        pytest.param("--bind-address", "--bindAddress", "127.0.0.1", "bind_address", "127.0.0.1", id="bind"),
        pytest.param("--debug-port", "--debugPort", "0", "debug_port", 0, id="debug-port"),
        pytest.param("--shutdown-delay", "--shutdownDelay", "1s", "shutdown_delay", 1.0, id="shutdown-delay"),
        pytest.param(
            "--max-request-body-bytes",
            "--maxRequestBodyBytes",
            "1Mi",
            "max_request_body_bytes",
            1024 * 1024,
            id="body-limit",
        ),
        pytest.param(
            "--ext-proc-transport",
            "--extProcTransport",
            "grpcio",
            "ext_proc_transport",
            "grpcio",
            id="transport",
        ),
    ],
)
def test_the_kebab_name_is_primary_and_the_camel_name_an_alias(
    primary: str, alias: str, value: str, field: str, expected: object
) -> None:
    pool = [] if field == "pool_name" else ["--pool-name", "p"]
    for name in (primary, alias, "-" + primary.lstrip("-")):
        config = parse_flags([*pool, f"{name}={value}"], {}).config
        assert getattr(config, field) == expected, name


def test_upstream_v1_defaults() -> None:
    c = parse_flags(["--pool-name", "p"], {}).config
    assert c.pool_group == V1_GROUP
    assert c.pool_namespace == "default"
    assert c.prober.refresh_interval == 0.05
    assert c.refresh_prometheus_metrics_interval == 5.0
    assert c.scheduler.metrics_staleness_threshold == 2.0
    assert (c.prober.scheme, c.prober.path, c.prober.port, c.prober.insecure_skip_verify) == (
        "http",
        "/metrics",
        0,
        True,
    )
    assert c.endpoint_subset_filter
    assert not c.enable_cert_reload
    assert not c.leader_election.enabled
    assert c.scheduler.profile is None  # no config: our measured default


def test_pool_namespace_falls_back_to_the_namespace_variable() -> None:
    assert parse_flags(["--pool-name", "p"], {"NAMESPACE": "team-a"}).config.pool_namespace == "team-a"
    assert (
        parse_flags(["--pool-name", "p", "--pool-namespace", "b"], {"NAMESPACE": "a"}).config.pool_namespace
        == "b"
    )


def test_the_v1alpha2_pool_group_selects_the_old_generation() -> None:
    c = parse_flags(["--pool-name", "p", "--pool-group", V1ALPHA2_GROUP], {}).config
    assert c.pool_group == defaults.V1ALPHA2_POOL_GROUP
    assert not c.api_v1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--pool-group", "example.com"], "invalid value", id="unknown-group"),
        pytest.param(
            ["--pool-name", "p", "--endpoint-selector", "a=b", "--endpoint-target-ports", "1"],
            "not both",
            id="pool-and-selector",
        ),
        pytest.param(["--endpoint-selector", "app=x"], "endpoint-target-ports", id="selector-without-ports"),
        pytest.param(
            ["--endpoint-selector", "app=x", "--endpoint-target-ports", "1,2,3,4,5,6,7,8,9"],
            "1 to 8",
            id="nine-ports",
        ),
        pytest.param(
            ["--endpoint-selector", "app x", "--endpoint-target-ports", "1"], "key=value", id="bad-selector"
        ),
        pytest.param(
            ["--endpoint-selector", "a=b", "--endpoint-target-ports", "0"], "out of range", id="port-zero"
        ),
        pytest.param(
            ["--pool-name", "p", "--config-file", "a", "--config-text", "b"], "cannot both", id="two-configs"
        ),
        pytest.param(
            ["--pool-name", "p", "--model-server-metrics-scheme", "ftp"], "invalid value", id="scheme"
        ),
        pytest.param(
            ["--pool-name", "p", "--model-server-metrics-path", "metrics"], "start with /", id="path"
        ),
        pytest.param(
            ["--pool-name", "p", "--config-file", "/nonexistent/x.yaml"], "cannot read", id="no-file"
        ),
    ],
)
def test_bad_v1_flags_are_flag_errors(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError, match=message):
        parse_flags(argv, {})


def test_standalone_ports_accept_lists_and_repeats_and_drop_duplicates() -> None:
    argv = [
        "--endpoint-selector",
        "app=x,tier=gpu",
        "--endpoint-target-ports",
        "8000,8001",
        "--endpoint-target-ports=8000",
    ]
    c = parse_flags(argv, {}).config
    assert c.endpoint_selector == (("app", "x"), ("tier", "gpu"))
    assert c.endpoint_target_ports == (8000, 8001)


@pytest.mark.parametrize("flag", REFUSED_METRIC_FLAGS)
@pytest.mark.parametrize("form", ["equals", "separate", "empty"])
def test_metric_flags_upstream_moved_into_the_config_are_refused(flag: str, form: str) -> None:
    value = {"equals": [f"{flag}=vllm:x"], "separate": [flag, "vllm:x"], "empty": [flag, ""]}[form]
    with pytest.raises(FlagError) as info:
        parse_flags(["--pool-name", "p", *value], {})
    message = str(info.value)
    assert flag in message
    assert "configure metrics via engineConfigs in EndpointPickerConfig" in message


def test_the_v03_metric_flags_still_set_the_default_engine() -> None:
    argv = [
        "--poolName",
        "p",
        "--totalQueuedRequestsMetric=q",
        "--kvCacheUsagePercentageMetric=kv",
        "--loraInfoMetric=",
    ]
    prober = parse_flags(argv, {}).config.prober
    assert (prober.metric_names.queued_requests, prober.metric_names.kv_cache_usage) == ("q", "kv")
    assert prober.metric_names.lora_info == ""
    assert prober.names_for("") == prober.names_for("vllm") == prober.metric_names
    assert prober.names_for("sglang").queued_requests == "sglang:num_queue_reqs"


@pytest.mark.parametrize(
    ("flag", "dest"), [pytest.param(f"--{d.replace('_', '-')}", d, id=d) for d in NO_OP_FLAGS]
)
def test_accepted_upstream_flags_say_once_what_they_do_here(flag: str, dest: str) -> None:
    on = parse_flags(["--pool-name", "p", flag], {})
    assert [n for n in on.notes if n.startswith(flag + ":")] == [NO_OP_FLAGS[dest]]
    for off in ([f"{flag}=false"], []):
        assert parse_flags(["--pool-name", "p", *off], {}).notes == ()


def test_model_server_metrics_flags_reach_the_prober() -> None:
    argv = [
        "--pool-name", "p", "--model-server-metrics-scheme", "https", "--model-server-metrics-path",
        "/prometheus/metrics", "--model-server-metrics-port", "9100",
        "--model-server-metrics-https-insecure-skip-verify=false", "--disable-endpoint-subset-filter",
    ]  # fmt: skip
    c = parse_flags(argv, {}).config
    assert (c.prober.scheme, c.prober.path, c.prober.port, c.prober.insecure_skip_verify) == (
        "https",
        "/prometheus/metrics",
        9100,
        False,
    )
    assert not c.endpoint_subset_filter


def test_a_config_file_and_the_scheduler_flag_cannot_both_choose() -> None:
    with pytest.raises(FlagError, match="--scheduler"):
        parse_flags(
            ["--pool-name", "p", "--scheduler=filter-tree", "--config-text", CHART_DEFAULT_PLUGINS], {}
        )


def test_a_bad_config_stops_the_start_naming_the_flag_and_the_entry() -> None:
    text = CHART_DEFAULT_PLUGINS.replace("type: queue-scorer", "type: queue-scorrer")
    with pytest.raises(FlagError) as info:
        parse_flags(["--pool-name", "p", "--config-text", text], {})
    assert str(info.value).startswith("--config-text: plugins[0] ('queue-scorrer'): unknown plugin type")


def test_help_lists_each_flag_once_with_its_alias_beside_it() -> None:
    parser = _parser()
    text = parser.format_help()
    lines = text.splitlines()
    for action in parser._actions:
        if action.help == "==SUPPRESS==" or not action.option_strings:
            continue
        primary, *aliases = action.option_strings
        where = [i for i, line in enumerate(lines) if re.match(rf"\s+{re.escape(primary)}\b", line)]
        assert len(where) == 1, primary
        for alias in aliases:
            assert alias in lines[where[0]], (primary, alias)
            assert (
                sum(len(re.findall(rf"(?<![\w-]){re.escape(alias)}(?![\w-])", line)) for line in lines) == 1
            )
    for refused in REFUSED_METRIC_FLAGS:
        assert refused not in text
