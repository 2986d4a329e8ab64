"""`python -m epp`: a bad command line exits 2; SIGTERM ends a running EPP cleanly with exit 0."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from epp.__main__ import main
from epp.server.event_loop import EventLoopUnavailable, loop_factory
from harness.base.eventually import eventually


def test_missing_pool_name_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--grpcPort", "0"]) == 2
    assert "poolName" in capsys.readouterr().err


def test_a_nan_threshold_exits_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KV_CACHE_THRESHOLD", "NaN")
    assert main(["--poolName", "p"]) == 2
    assert "epp: KV_CACHE_THRESHOLD=nan: must be a number from 0 to 1" in capsys.readouterr().err


KUBECONFIG = """\
apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
"""


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_signal_stops_the_process_cleanly(tmp_path: Path, sig: signal.Signals, loop: str) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop", reason="uvloop is not installed (the EPP then runs on asyncio's loop)")
    # The API server is unreachable: the watches keep retrying, which is what a live EPP does anyway.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    log = tmp_path / "epp.log"
    argv = [
        sys.executable, "-m", "epp", "-poolName", "pool", "-bindAddress", "127.0.0.1", "-grpcPort", "0",
        "-grpcHealthPort", "0", "-metricsPort", "0", "-debugPort", "0", "-kubeconfig", str(kubeconfig),
        "-v", "4", f"--eventLoop={loop}",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:

            def started() -> None:
                assert proc.poll() is None, log.read_text()
                assert "endpoint picker for pool default/pool" in log.read_text()

            eventually(started, timeout=30)
            proc.send_signal(sig)
            assert proc.wait(timeout=30) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert f"event loop: {loop}." in text
    assert "endpoint picker stopped" in text
    assert "Traceback" not in text


def test_loop_choice() -> None:
    assert loop_factory("asyncio") is None
    if importlib.util.find_spec("uvloop") is not None:
        factory = loop_factory("auto")
        assert factory is not None
        loop = factory()
        try:
            assert type(loop).__module__.startswith("uvloop")
        finally:
            loop.close()


def test_uvloop_asked_for_but_missing_is_a_readable_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert loop_factory("auto") is None
    with pytest.raises(EventLoopUnavailable, match="uvloop is not installed"):
        loop_factory("uvloop")


def test_upstream_logging_flags_run_and_log_json(tmp_path: Path) -> None:
    """Upstream manifests pass `--zap-encoder json` and `-v`; these once made the EPP exit with 2."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    log = tmp_path / "epp.log"
    argv = [
        sys.executable, "-m", "epp", "--poolName", "pool", "--bindAddress", "127.0.0.1", "--grpcPort", "0",
        "--grpcHealthPort", "0", "--metricsPort", "0", "--kubeconfig", str(kubeconfig), "-v", "3",
        "--zap-encoder", "json", "--zap-log-level", "info", "--zap-devel=false",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:

            def started() -> None:
                assert proc.poll() is None, log.read_text()
                assert "endpoint picker for pool default/pool" in log.read_text()

            eventually(started, timeout=30)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    started_record = next(r for r in records if "endpoint picker for pool" in r["msg"])
    assert started_record["level"] == "info"
    assert started_record["logger"] == "epp.server.runner"
    assert isinstance(started_record["ts"], float)
