"""`EnvoyOptions.v1()`: the bootstrap of upstream's test envoy.yaml (v1.0.0 … v1.5.0), accepted by Envoy.

Full duplex both ways, response headers SEND, trailers SEND both ways, message_timeout 1000 s; with
`subset_hint_header`, a header_to_metadata filter ahead of ext_proc makes the subset hint metadata and
ext_proc forwards that namespace to the EPP.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from harness.base.binaries import envoy_path
from harness.base.ports import reserve_port
from harness.cluster.certs import TinyCA
from harness.dataplane.envoy import (
    SERVED_KEY,
    SUBSET_HINT_KEY,
    SUBSET_HINT_NAMESPACE,
    EnvoyOptions,
    ExtProcTls,
    bootstrap_json,
    build_bootstrap,
    model_server_endpoints_json,
)

SUBSET_HEADER = "x-test-subset"


def validated(tmp_path: Path, options: EnvoyOptions) -> dict[str, Any]:
    """The bootstrap as JSON, after Envoy has validated it."""
    eds = tmp_path / "model-eds" / "endpoints.json"
    eds.parent.mkdir(exist_ok=True)
    eds.write_text(model_server_endpoints_json(["127.0.0.2:8000"], 1))
    bootstrap = build_bootstrap(
        listener_port=18080,
        admin_port=19901,
        ext_proc_host="127.0.0.1",
        ext_proc_port=9002,
        access_log_path=tmp_path / "access.log",
        options=options,
        ext_proc_tls=ExtProcTls(ca_pem=TinyCA().cert_pem, server_name="epp.harness-test.svc"),
        model_server_endpoints_path=eds,
    )
    config = tmp_path / "bootstrap.json"
    config.write_text(bootstrap_json(bootstrap))
    with reserve_port() as base_id:
        result = subprocess.run(
            [str(envoy_path()), "--mode", "validate", "-c", str(config), "--base-id", str(base_id.port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    config_json: dict[str, Any] = json.loads(config.read_text())
    return config_json


def http_filters(tmp_path: Path, options: EnvoyOptions) -> list[dict[str, Any]]:
    """The listener's HTTP filters, after Envoy has validated the whole bootstrap."""
    listener = validated(tmp_path, options)["staticResources"]["listeners"][0]
    hcm = listener["filterChains"][0]["filters"][0]["typedConfig"]
    filters: list[dict[str, Any]] = hcm["httpFilters"]
    return filters


@pytest.mark.parametrize(
    ("options", "names"),
    [
        pytest.param(EnvoyOptions.v1(), ["ext_proc", "header_to_metadata", "router"], id="v1"),
        pytest.param(
            EnvoyOptions.v1(subset_hint_header=SUBSET_HEADER),
            ["header_to_metadata", "ext_proc", "header_to_metadata", "router"],
            id="v1-with-subset-hint-header",
        ),
    ],
)
def test_v1_mode_is_upstreams_test_envoy(tmp_path: Path, options: EnvoyOptions, names: list[str]) -> None:
    filters = http_filters(tmp_path, options)
    assert [f["name"].rsplit(".", 1)[-1] for f in filters] == names
    ext_proc = filters[names.index("ext_proc")]["typedConfig"]
    assert ext_proc["processingMode"] == {
        "requestHeaderMode": "SEND",
        "responseHeaderMode": "SEND",
        "requestBodyMode": "FULL_DUPLEX_STREAMED",
        "responseBodyMode": "FULL_DUPLEX_STREAMED",
        "requestTrailerMode": "SEND",
        "responseTrailerMode": "SEND",
    }
    assert ext_proc["messageTimeout"] == "1000s"
    forwarded = ext_proc["metadataOptions"].get("forwardingNamespaces", {}).get("untyped", [])
    assert forwarded == ([SUBSET_HINT_NAMESPACE] if options.subset_hint_header else []) + ["envoy.lb"]
    # The served endpoint (after fallbacks): the route stamps the upstream host on the response,
    # the filter just before the router moves it into envoy.lb metadata and off the response.
    (served_rule,) = filters[-2]["typedConfig"]["responseRules"]
    assert served_rule["header"] == SERVED_KEY
    assert served_rule["remove"] is True
    assert served_rule["onHeaderPresent"]["metadataNamespace"] == "envoy.lb"
    assert served_rule["onHeaderPresent"]["key"] == SERVED_KEY
    route = validated(tmp_path, options)["staticResources"]["listeners"][0]["filterChains"][0]["filters"][0][
        "typedConfig"
    ]["routeConfig"]["virtualHosts"][0]["routes"][0]
    (stamp,) = route["responseHeadersToAdd"]
    assert stamp["header"] == {"key": SERVED_KEY, "value": "%UPSTREAM_HOST%"}
    assert stamp["appendAction"] == "OVERWRITE_IF_EXISTS_OR_ADD"
    if options.subset_hint_header:
        (rule,) = filters[0]["typedConfig"]["requestRules"]
        assert rule["header"] == SUBSET_HEADER
        assert rule["remove"] is True
        present = rule["onHeaderPresent"]
        assert (present["metadataNamespace"], present["key"]) == (SUBSET_HINT_NAMESPACE, SUBSET_HINT_KEY)


def test_the_default_stays_the_v1alpha2_buffered_set_up(tmp_path: Path) -> None:
    (ext_proc, _) = http_filters(tmp_path, EnvoyOptions())
    mode = ext_proc["typedConfig"]["processingMode"]
    assert mode["requestBodyMode"] == "BUFFERED"
    assert mode["responseHeaderMode"] == "SKIP"
    assert "responseBodyMode" not in mode  # NONE, the proto default


def model_servers(tmp_path: Path, options: EnvoyOptions) -> dict[str, Any]:
    clusters = validated(tmp_path, options)["staticResources"]["clusters"]
    [cluster] = [c for c in clusters if c["name"] == "model_servers"]
    return cluster


def test_v1_mode_walks_the_epps_list_over_the_pools_endpoints(tmp_path: Path) -> None:
    # Upstream's ORIGINAL_DST reads one address; v1 mode's cluster takes the EPP's comma list from
    # the metadata (override_host) over the endpoints a file gives, and retries a refused connection.
    cluster = model_servers(tmp_path, EnvoyOptions.v1())
    assert cluster["type"] == "EDS"
    assert cluster["edsClusterConfig"]["edsConfig"]["pathConfigSource"]["path"].endswith("endpoints.json")
    [policy] = cluster["loadBalancingPolicy"]["policies"]
    override = policy["typedExtensionConfig"]["typedConfig"]
    assert override["@type"].endswith("OverrideHost")
    [source] = override["overrideHostSources"]
    assert source["metadata"] == {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}


def test_the_default_reads_one_address_from_the_metadata(tmp_path: Path) -> None:
    cluster = model_servers(tmp_path, EnvoyOptions())
    assert (cluster["type"], cluster["lbPolicy"]) == ("ORIGINAL_DST", "CLUSTER_PROVIDED")
