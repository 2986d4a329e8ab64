"""`harness.subject.foreign_epp`: the command line an EPP gets, and readiness that means "Envoy can use it".

A stand-in EPP (`fake_epp.py`) plays the cases that matter: health SERVING while nothing listens on
ext_proc (upstream v0.3.0's start-up gap), a certificate other than the one handed over, health
NOT_SERVING. No cluster: the kubeconfig is never read by the stand-in.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.base.binaries import BinaryNotFoundError
from harness.base.ports import reserve_port
from harness.base.process import ProcessStartError
from harness.cluster import go_binaries
from harness.subject.foreign_epp import EppCommand, ForeignEpp, sim_metric_args

FAKE = str(Path(__file__).with_name("fake_epp.py"))


def fake(mode: str, fixed_ports: tuple[int, ...] = ()) -> EppCommand:
    return EppCommand((sys.executable, FAKE, f"--mode={mode}"), "upstream", fixed_ports, f"fake {mode}")


def launcher(command: EppCommand, **kwargs: object) -> ForeignEpp:
    return ForeignEpp(command, "pool", "ns", Path("/nonexistent/kubeconfig"), **kwargs)  # type: ignore[arg-type]


def test_an_epp_that_serves_verified_tls_is_started_and_serving() -> None:
    with launcher(fake("good"), extra_args=["--extra=1"], ours_args=["--bindAddress=127.0.0.1"]) as epp:
        epp.wait_serving(timeout=10)
        argv = epp.argv()
    assert argv[:3] == [sys.executable, FAKE, "--mode=good"]
    flags = {arg.split("=")[0] for arg in argv[3:]}
    assert flags == {
        "--poolName",
        "--poolNamespace",
        "--kubeconfig",
        "--grpcPort",
        "--grpcHealthPort",
        "--metricsPort",
        "--certPath",
        "-v",
        "--extra",
    }  # upstream's names only: none of our Python-only flags (--bindAddress, --debugPort)
    assert "--poolName=pool" in argv
    assert epp.debug_url is None


def test_health_serving_without_an_ext_proc_listener_is_not_ready() -> None:
    epp = launcher(fake("health-only"))
    with pytest.raises(ProcessStartError, match="not healthy"):
        epp.start(timeout=3)
    assert not epp.running


def test_an_epp_that_ignores_cert_path_is_not_ready() -> None:
    epp = launcher(fake("own-cert"))
    with pytest.raises(ProcessStartError, match="CERTIFICATE_VERIFY_FAILED"):
        epp.start(timeout=3)


def test_ready_for_envoy_is_not_serving_until_health_says_so() -> None:
    with launcher(fake("not-serving")) as epp, pytest.raises(AssertionError, match="NOT_SERVING"):
        epp.wait_serving(timeout=1)


def test_a_fixed_port_held_by_another_instance_is_a_clear_error() -> None:
    with reserve_port() as free:
        port = free.port
    with launcher(fake("good", (port,))) as first:
        second = launcher(fake("good", (port,)))
        with pytest.raises(RuntimeError, match=f"always binds port {port}"):
            second.start(timeout=10)
        assert not second.running
        assert first.running
    with launcher(fake("good", (port,))):  # released with the first one
        pass


def test_our_epp_gets_our_flags_and_others_do_not() -> None:
    ours = EppCommand.ours()
    assert ours.dialect == "ours"
    assert sim_metric_args(ours) == []
    other = EppCommand.parse("/opt/epp -zap-devel=false", label="theirs")
    assert other.argv == ("/opt/epp", "-zap-devel=false")
    assert (other.dialect, other.name) == ("upstream", "theirs")
    assert sim_metric_args(other) == ["--kvCacheUsagePercentageMetric=vllm:kv_cache_usage_perc"]


def test_the_upstream_epp_not_built_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPP_HARNESS_CACHE", str(tmp_path))
    monkeypatch.delenv("TEST_ASSET_UPSTREAM_EPP", raising=False)
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setattr("harness.cluster.gobuild.DEFAULT_ASSETS_DIR", tmp_path / "none")
    with pytest.raises(BinaryNotFoundError, match=r"harness build --upstream-epp v0\.3\.0"):
        EppCommand.upstream()
    assert go_binaries.find_upstream_epp() is None
