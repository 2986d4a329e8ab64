"""`python -m epp`: a bad command line exits 2; SIGTERM ends a running EPP cleanly with exit 0."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from epp.__main__ import main
from harness.eventually import eventually


def test_missing_pool_name_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--grpcPort", "0"]) == 2
    assert "poolName" in capsys.readouterr().err


KUBECONFIG = """\
apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_signal_stops_the_process_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    # The API server is unreachable: the watches keep retrying, which is what a live EPP does anyway.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    log = tmp_path / "epp.log"
    argv = [
        sys.executable, "-m", "epp", "-poolName", "pool", "-bindAddress", "127.0.0.1", "-grpcPort", "0",
        "-grpcHealthPort", "0", "-metricsPort", "0", "-kubeconfig", str(kubeconfig), "-v", "4",
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
    assert "endpoint picker stopped" in text
    assert "Traceback" not in text
