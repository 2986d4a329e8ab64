"""harness.subject.flag_profiles: each EPP started with its own dialect's flags, read off its --help."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.base.ports import reserve_port
from harness.cluster import releases
from harness.dataplane.envoy import EnvoyOptions
from harness.subject import flag_profiles
from harness.subject.flag_profiles import LWEPP, V0_3, V1, FlagProfileError
from harness.subject.foreign_epp import EppCommand, ForeignEpp

from .fake_epps import LWEPP_HELP, V0_3_HELP, V1_HELP, fake_epp


@pytest.mark.parametrize(
    ("help_text", "profile"),
    [
        pytest.param(V0_3_HELP, V0_3, id="gie-v0.3.0-camelCase"),
        pytest.param(V1_HELP, V1, id="gie-v1.5.0-kebab-case"),
        pytest.param(LWEPP_HELP, LWEPP, id="gie-v1.6.0-lwepp"),
    ],
)
def test_the_dialect_is_read_off_the_help(help_text: str, profile: flag_profiles.FlagProfile) -> None:
    assert flag_profiles.detect(help_text) is profile
    flag_profiles.check(profile, help_text)


def test_a_help_of_no_known_dialect_says_what_to_pass() -> None:
    with pytest.raises(FlagProfileError, match="--epp-flags"):
        flag_profiles.detect("Usage: my-epp [--port N]\n")


@pytest.mark.parametrize(
    ("profile", "help_text", "named"),
    [
        pytest.param(V0_3, V1_HELP, "--poolName", id="v0.3-flags-to-a-v1-epp"),
        pytest.param(V1, LWEPP_HELP, "--cert-path", id="v1-flags-to-lwepp"),
        pytest.param(V1, V0_3_HELP, "--pool-name", id="v1-flags-to-a-v0.3-epp"),
    ],
)
def test_a_mismatch_names_the_flag_and_the_profile_that_fits(
    profile: flag_profiles.FlagProfile, help_text: str, named: str
) -> None:
    fits = flag_profiles.detect(help_text).name
    with pytest.raises(FlagProfileError, match=f"does not take {named}") as caught:
        flag_profiles.check(profile, help_text)
    assert f"--epp-flags {fits}" in str(caught.value)


def test_a_flag_is_listed_only_as_a_whole_name() -> None:
    assert flag_profiles.lists("  -v, --v Level", "-v")
    assert not flag_profiles.lists("      --pool-name-prefix string", "--pool-name")
    assert not flag_profiles.lists("set the pool-name here", "--pool-name")


def test_a_command_line_gets_the_profile_of_its_binary(tmp_path: Path) -> None:
    command = EppCommand.from_text(f"{fake_epp(tmp_path, LWEPP_HELP)} --zap-devel")
    assert command.flags is LWEPP
    assert command.argv[1:] == ("--zap-devel",)
    assert EppCommand.from_text(str(fake_epp(tmp_path, V1_HELP)), flags="v1").flags is V1
    with pytest.raises(FlagProfileError, match=r"does not take --poolName, .*--certPath"):
        EppCommand.from_text(str(fake_epp(tmp_path, V1_HELP)), flags="v0.3")
    with pytest.raises(FlagProfileError, match="cannot read the flags"):
        EppCommand.from_text(str(tmp_path / "missing-epp"))


@pytest.mark.parametrize(
    ("help_text", "expected", "absent"),
    [
        pytest.param(
            V0_3_HELP,
            ["--poolName=pool", "--grpcPort=", "--certPath=", "-v=2", "--kubeconfig="],
            ["--pool-group"],
            id="v0.3",
        ),
        pytest.param(
            V1_HELP,
            [
                "--pool-name=pool",
                "--pool-namespace=ns",
                "--grpc-port=",
                "--cert-path=",
                "-v=2",
                "--pool-group=",
            ],
            ["--poolName", "--kvCacheUsagePercentageMetric", "--kubeconfig"],  # v1.5.0 has no such flag
            id="v1",
        ),
        pytest.param(
            LWEPP_HELP,
            ["--pool-name=pool", "--grpc-health-port=", "--pool-group=", "--kubeconfig="],
            ["--cert-path", "-v=", "--certPath"],
            id="lwepp",
        ),
    ],
)
def test_the_harness_passes_its_settings_in_the_dialect(
    tmp_path: Path, help_text: str, expected: list[str], absent: list[str]
) -> None:
    command = EppCommand.from_text(str(fake_epp(tmp_path, help_text)))
    epp = ForeignEpp(command, "pool", "ns", tmp_path / "kubeconfig", pool_group=releases.V1.pool_group)
    # What start() sets up before it builds the command line: ports and a certificate directory.
    epp._ports = {name: reserve_port() for name in ("grpc", "health", "metrics")}
    epp._cert_dir, epp._ca_pem = tmp_path / "certs", b"a CA"
    try:
        args = epp.argv()[1:]
    finally:
        for reservation in epp._ports.values():
            reservation.release()
    for prefix in expected:
        assert any(a.startswith(prefix) for a in args), (prefix, args)
    for prefix in absent:
        assert not any(a.startswith(prefix) for a in args), (prefix, args)
    # An EPP that takes no certificate serves its own: Envoy cannot verify it.
    assert (epp.ext_proc_tls.ca_pem == b"") == (command.flags.cert_path is None)


@pytest.mark.parametrize(
    ("help_text", "request_mode", "response_mode"),
    [
        pytest.param(V0_3_HELP, "BUFFERED", "NONE", id="v0.3-answers-headers-first"),
        pytest.param(V1_HELP, "FULL_DUPLEX_STREAMED", "NONE", id="v1-full-duplex"),
        # lwepp's replies are refused in full duplex (tests/unit/envoy/test_lwepp_mode.py).
        pytest.param(LWEPP_HELP, "STREAMED", "NONE", id="lwepp-buffered-then-streamed"),
    ],
)
def test_envoy_talks_to_each_epp_in_its_protocol_keeping_the_scenarios_settings(
    tmp_path: Path, help_text: str, request_mode: str, response_mode: str
) -> None:
    base = EnvoyOptions(subset_hint_header="x-test-subset", buffer_limit_bytes=1234)
    options = EppCommand.from_text(str(fake_epp(tmp_path, help_text))).envoy_options(base)
    assert (options.request_body_mode, options.response_body_mode) == (request_mode, response_mode)
    assert (options.subset_hint_header, options.buffer_limit_bytes) == ("x-test-subset", 1234)
    if request_mode != "BUFFERED":
        assert options.message_timeout_s == EnvoyOptions.v1().message_timeout_s
    if request_mode == "STREAMED":
        assert options.buffer_request_body
        assert options.body_before_header_response
    assert EppCommand.ours().envoy_options(base) == base  # ours speaks both: the scenario decides
