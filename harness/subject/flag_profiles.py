"""How the harness passes its settings to an EPP, per flag dialect: the profiles of today's EPPs.

Upstream renamed every flag between v0.3.0 (Go ``flag``, camelCase: ``-poolName``) and v1.0.0 (pflag,
kebab-case: ``--pool-name``), and v1.6.0's lightweight reference EPP (``cmd/lwepp``) takes a reduced
set (no ``--cert-path``: it always serves a fresh self-signed certificate; no ``-v``; its health
service is ``inference-extension``). An EPP exits with "unknown flag" (exit 2) on a name it does not
know, so starting one with another dialect's flags fails every scenario identically. A profile says
which names to use; ``detect`` reads them off the EPP's own ``--help``, and ``check`` refuses a
profile whose flags the help does not list, naming the flag. Facts: ../shared/reference/upstream-v1.md
§b (flags per release), §h (what the built binaries print).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from epp.pickerconfig import API_VERSION as PICKER_CONFIG_API_VERSION
from epp.pickerconfig import KIND as PICKER_CONFIG_KIND


@dataclass(frozen=True)
class FlagProfile:
    """The flag names of one dialect; None where the dialect has no such flag."""

    name: str
    pool_name: str
    pool_namespace: str
    grpc_port: str
    grpc_health_port: str
    metrics_port: str
    kubeconfig: str | None  # None: no such flag (v1.5.0's full EPP): the EPP reads $KUBECONFIG
    cert_path: str | None  # None: the EPP serves a self-signed certificate nobody can verify
    verbosity: str | None
    pool_group: str | None = None
    # Flags pointing the EPP at the simulators' metric names, where its defaults differ from them.
    metric_args: tuple[str, ...] = ()
    health_service: str = ""  # the gRPC health service that says the pool is known
    # How Envoy must talk to it: v0.3.0's default server answers the headers before it reads a
    # BUFFERED body; v1.x EPPs (full and lightweight) serve only FULL_DUPLEX_STREAMED bodies and do
    # not answer the headers until the body came, so a BUFFERED Envoy waits out its message timeout.
    # lwepp (v1.6.0) answers every request-body chunk with a plain CONTINUE, and the headers only once
    # the body is complete: Envoy 1.40 refuses both in full duplex ("spurious_message: Normal body
    # mutation response is received while body mode is FULL_DUPLEX_STREAMED", and a body reply before
    # the headers reply), so it gets `EnvoyOptions.lwepp()` instead.
    envoy_protocol: Literal["v0.3", "v1", "lwepp"] = "v0.3"
    # Capabilities (`harness.verdicts.departures.CAPABILITIES`) the EPPs of this dialect do not have:
    # scenarios that need one are "not applicable" to them, never a FAIL.
    lacks: frozenset[str] = frozenset()
    # The flag that takes an EndpointPickerConfig as text (v1.x's full EPPs): how the harness turns
    # on upstream's test plugins (`test_plugin_args`); None where they need no config (lwepp has them
    # built in) or do not exist (v0.3.0, which also lacks "test-plugins").
    config_text: str | None = None

    def flags(self) -> tuple[str, ...]:
        """Every flag name the harness may pass in this dialect."""
        names = (
            self.pool_name,
            self.pool_namespace,
            self.grpc_port,
            self.grpc_health_port,
            self.metrics_port,
            self.kubeconfig,
            self.cert_path,
            self.verbosity,
            self.pool_group,
        )
        return tuple(n for n in names if n) + tuple(a.split("=", 1)[0] for a in self.metric_args)


V0_3: Final = FlagProfile(
    name="v0.3",
    pool_name="--poolName",
    pool_namespace="--poolNamespace",
    grpc_port="--grpcPort",
    grpc_health_port="--grpcHealthPort",
    metrics_port="--metricsPort",
    kubeconfig="--kubeconfig",
    cert_path="--certPath",
    verbosity="-v",
    # v0.3.0 reads vllm:gpu_cache_usage_perc by default; vLLM >= 0.10 (and the simulators) publish this.
    metric_args=("--kvCacheUsagePercentageMetric=vllm:kv_cache_usage_perc",),
    # v0.3.0 has no HA mode (upstream #1264 came later) and no plugins (no config file at all).
    lacks=frozenset({"leader-election", "test-plugins"}),
)
V1: Final = FlagProfile(
    name="v1",
    pool_name="--pool-name",
    pool_namespace="--pool-namespace",
    grpc_port="--grpc-port",
    grpc_health_port="--grpc-health-port",
    metrics_port="--metrics-port",
    # v1.x's full EPP registers no --kubeconfig ("unknown flag"; upstream-v1.md §h): $KUBECONFIG it is.
    kubeconfig=None,
    cert_path="--cert-path",
    verbosity="-v",
    pool_group="--pool-group",
    envoy_protocol="v1",
    config_text="--config-text",
)
LWEPP: Final = FlagProfile(
    name="lwepp",
    pool_name="--pool-name",
    pool_namespace="--pool-namespace",
    grpc_port="--grpc-port",
    grpc_health_port="--grpc-health-port",
    metrics_port="--metrics-port",
    kubeconfig="--kubeconfig",
    cert_path=None,
    verbosity=None,
    pool_group="--pool-group",
    health_service="inference-extension",
    envoy_protocol="lwepp",
    # Round robin over the pool's pods (or the test header's pick); it scrapes no metrics, reads no
    # model objects and does not parse the body (upstream-v1.md §b, §c).
    lacks=frozenset(
        {
            "load-aware-picking",
            "load-shedding",
            "model-aware-routing",
            "request-metrics",
            "request-validation",
            "leader-election",  # no --ha-enable-leader-election
        }
    ),
)
PROFILES: Final = {profile.name: profile for profile in (V0_3, V1, LWEPP)}
# Upstream's two test plugins in a profile of their own, as its gateway conformance runs configure
# a full EPP: the `test-epp-endpoint-selection` header chooses the endpoint (`header-based-testing-filter`,
# then the highest score of no scorer: any of those named), and the response carries back the
# endpoint the proxy reported as served (`destination-endpoint-served-verifier`).
TEST_PLUGINS_CONFIG: Final = f"""\
apiVersion: {PICKER_CONFIG_API_VERSION}
kind: {PICKER_CONFIG_KIND}
plugins:
- type: header-based-testing-filter
- type: destination-endpoint-served-verifier
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: header-based-testing-filter
  - pluginRef: max-score-picker
"""


def test_plugin_args(profile: FlagProfile) -> tuple[str, ...]:
    """The arguments that turn on upstream's test plugins for an EPP of `profile` (none for lwepp,
    which has them built in). Only for a profile that does not lack "test-plugins"."""
    if profile.config_text is None:
        return ()
    return (f"{profile.config_text}={TEST_PLUGINS_CONFIG}",)


HELP_TIMEOUT_S: Final = 20.0


class FlagProfileError(ValueError):
    """No profile fits the EPP, or the one asked for names a flag its ``--help`` does not list."""


def by_name(name: str) -> FlagProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise FlagProfileError(f"unknown flag profile {name!r}: one of {', '.join(PROFILES)}") from None


def lists(help_text: str, flag: str) -> bool:
    """Whether ``--help`` output lists ``flag`` (Go's ``flag`` prints ``-name``, pflag ``--name``)."""
    bare = flag.lstrip("-")
    for token in help_text.replace(",", " ").replace("=", " ").split():
        if token.lstrip("-") == bare and token.startswith("-"):
            return True
    return False


def detect(help_text: str) -> FlagProfile:
    """The profile whose flags the help lists: v0.3 camelCase, v1 kebab-case, or lwepp's reduced set."""
    if lists(help_text, "poolName"):
        return V0_3
    if lists(help_text, "pool-name"):
        return V1 if lists(help_text, "cert-path") else LWEPP
    raise FlagProfileError(
        "the EPP's --help lists neither --poolName (v0.3) nor --pool-name (v1, lwepp): pass --epp-flags "
        f"with one of {', '.join(PROFILES)}"
    )


def check(profile: FlagProfile, help_text: str) -> None:
    """Raise naming the first flags of ``profile`` that the help does not list."""
    missing = [flag for flag in profile.flags() if not lists(help_text, flag)]
    if missing:
        try:
            hint = (
                f"; its help fits the {detect(help_text).name} profile (--epp-flags {detect(help_text).name})"
            )
        except FlagProfileError:
            hint = ""
        raise FlagProfileError(
            f"the EPP does not take {', '.join(missing)} (flag profile {profile.name}): its --help lists "
            f"no such flag{hint}"
        )


def help_text(argv: Sequence[str], timeout: float = HELP_TIMEOUT_S) -> str:
    """What ``argv --help`` prints (stdout and stderr: Go's ``flag`` prints its usage to stderr)."""
    try:
        run = subprocess.run(
            [*argv, "--help"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FlagProfileError(
            f"cannot read the flags of {argv[0]}: `{argv[0]} --help` failed: {exc}"
        ) from exc
    return run.stdout + run.stderr


def resolve(argv: Sequence[str], name: str | None = None) -> FlagProfile:
    """The profile for the EPP ``argv``: ``name``'s, checked against its help, else the detected one."""
    text = help_text(argv)
    if name is None:
        return detect(text)
    profile = by_name(name)
    check(profile, text)
    return profile
