"""Envoy's bootstrap for several EPP replicas: every replica an endpoint, active gRPC health checks
on each one's plaintext health port (ext_proc itself stays on verified TLS), and a retry on another
replica for a stream that could not start. Envoy itself validates the result."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from harness.base.binaries import envoy_path
from harness.base.ports import reserve_port
from harness.cluster.certs import TinyCA
from harness.dataplane.envoy import (
    HEALTH_CHECK_MATCH,
    EnvoyOptions,
    ExtProcHealthCheck,
    ExtProcReplica,
    ExtProcTls,
    bootstrap_json,
    build_bootstrap,
)

REPLICAS = [ExtProcReplica("127.0.0.1:9002", health_port=9003), ExtProcReplica("127.0.0.2:9002", 9003)]


def ext_proc_cluster(tmp_path: Path, options: EnvoyOptions) -> dict[str, Any]:
    bootstrap = build_bootstrap(
        listener_port=18080,
        admin_port=19901,
        ext_proc_host="127.0.0.1",
        ext_proc_port=1,  # replaced by the replicas
        access_log_path=tmp_path / "access.log",
        options=options,
        ext_proc_tls=ExtProcTls(ca_pem=TinyCA().cert_pem, server_name="pool-epp.ns.svc"),
        ext_proc_replicas=REPLICAS,
    )
    config = tmp_path / "bootstrap.json"
    config.write_text(bootstrap_json(bootstrap))
    with reserve_port() as base_id:  # validate mode still claims hot-restart resources
        result = subprocess.run(
            [str(envoy_path()), "--mode", "validate", "-c", str(config), "--base-id", str(base_id.port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(config.read_text())
    cluster: dict[str, Any] = next(
        c for c in document["staticResources"]["clusters"] if c["name"] == "ext_proc"
    )
    cluster["_filter"] = document["staticResources"]["listeners"][0]["filterChains"][0]["filters"][0]
    return cluster


def test_each_replica_is_health_checked_on_its_health_port_in_plaintext(tmp_path: Path) -> None:
    options = EnvoyOptions(ext_proc_health_check=ExtProcHealthCheck(interval_s=0.5), ext_proc_retries=1)
    cluster = ext_proc_cluster(tmp_path, options)

    endpoints = cluster["loadAssignment"]["endpoints"][0]["lbEndpoints"]
    assert [
        (
            e["endpoint"]["address"]["socketAddress"]["address"],
            e["endpoint"]["healthCheckConfig"]["portValue"],
        )
        for e in endpoints
    ] == [("127.0.0.1", 9003), ("127.0.0.2", 9003)]
    (check,) = cluster["healthChecks"]
    assert "grpcHealthCheck" in check
    assert check["interval"] == check["noTrafficInterval"] == "0.500s"
    assert check["transportSocketMatchCriteria"] == {HEALTH_CHECK_MATCH: True}
    (plaintext,) = cluster["transportSocketMatches"]
    assert plaintext["match"] == {HEALTH_CHECK_MATCH: True}
    assert plaintext["transportSocket"]["name"] == "envoy.transport_sockets.raw_buffer"
    assert cluster["transportSocket"]["name"] == "envoy.transport_sockets.tls"  # ext_proc itself


def test_a_stream_that_could_not_start_is_retried_on_another_replica(tmp_path: Path) -> None:
    cluster = ext_proc_cluster(tmp_path, EnvoyOptions(ext_proc_retries=1))

    retry = json.dumps(cluster["_filter"])
    assert '"retryOn": "connect-failure,refused-stream"' in retry
    assert "envoy.retry_host_predicates.previous_hosts" in retry
    thresholds = cluster["circuitBreakers"]["thresholds"][0]
    assert thresholds["maxRetries"] > 3, "Envoy's default of 3 retries in flight turns most away"


def test_without_replica_options_nothing_changes(tmp_path: Path) -> None:
    cluster = ext_proc_cluster(tmp_path, EnvoyOptions())
    assert "healthChecks" not in cluster
    assert "circuitBreakers" not in cluster
    assert "retryPolicy" not in json.dumps(cluster["_filter"])


def test_dynamic_endpoints_come_from_a_watched_file_and_tls_may_be_unverified(tmp_path: Path) -> None:
    """What `harness.subject.chart_install` uses: file-based EDS (rewritten as EPP pods come and go) and TLS
    that trusts each replica's self-signed certificate, both accepted by Envoy's own validation."""
    from harness.cluster.certs import UNVERIFIED_EXT_PROC_TLS
    from harness.dataplane.envoy import ext_proc_endpoints_json

    eds = tmp_path / "eds" / "ext_proc_endpoints.json"
    eds.parent.mkdir()
    eds.write_text(ext_proc_endpoints_json(REPLICAS, 1))
    options = EnvoyOptions(ext_proc_health_check=ExtProcHealthCheck(), ext_proc_dynamic_endpoints=True)
    bootstrap = build_bootstrap(
        listener_port=18080, admin_port=19901, ext_proc_host="127.0.0.1", ext_proc_port=1,
        access_log_path=tmp_path / "access.log", options=options, ext_proc_tls=UNVERIFIED_EXT_PROC_TLS,
        ext_proc_replicas=REPLICAS, ext_proc_endpoints_path=eds,
    )  # fmt: skip
    config = tmp_path / "bootstrap.json"
    config.write_text(bootstrap_json(bootstrap))
    with reserve_port() as base_id:
        result = subprocess.run(
            [str(envoy_path()), "--mode", "validate", "-c", str(config), "--base-id", str(base_id.port)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    cluster = json.loads(config.read_text())["staticResources"]["clusters"][0]
    assert cluster["type"] == "EDS"
    assert cluster["edsClusterConfig"]["edsConfig"]["pathConfigSource"]["path"] == str(eds)
    assert "validationContext" not in json.dumps(cluster["transportSocket"])
    endpoints = json.loads(eds.read_text())["resources"][0]["endpoints"][0]["lbEndpoints"]
    assert [e["endpoint"]["healthCheckConfig"]["portValue"] for e in endpoints] == [9003, 9003]
