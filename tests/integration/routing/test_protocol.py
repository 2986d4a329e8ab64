"""The request/response protocol through the real ext_proc server (epp-behaviour.md §6, §8.2, §9.14/§9.15).

Body handling (passthrough vs rewrite), usage accounting from a streamed response, bodyless requests,
and the error statuses a client sees: 400 invalid JSON, 404 unknown model, 503 no ready pod.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.beds.testbed import TestBed
from tests.integration.routing.hermetic import DIRECT, MY_MODEL, MY_MODEL_TARGET, PODS


def sample(metrics_text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def test_direct_model_passes_the_body_through_unchanged(hermetic: TestBed) -> None:
    raw = b'{"max_tokens":100,"model":"direct-model","prompt":"test6","temperature":0}'
    whole = hermetic.route(DIRECT, body=raw)
    assert whole.status == 200, whole.message
    assert whole.body is None, "an unchanged single-message body needs no mutation"
    assert "content-length" not in whole.set_headers

    split = hermetic.route(DIRECT, body=raw, chunks=2)
    assert split.status == 200, split.message
    assert split.body == raw, "held chunks come back byte for byte, in one piece"
    assert "content-length" not in split.set_headers
    assert hermetic.pod_for_endpoint(split.endpoint) in PODS


def test_target_model_rewrites_the_body_and_its_content_length(hermetic: TestBed) -> None:
    raw = '{"model":"my-model","prompt":"héllo","temperature":0,"max_tokens":100,"n":1}'.encode()
    result = hermetic.route(MY_MODEL, body=raw)
    assert result.status == 200, result.message
    assert result.body is not None
    sent = json.loads(result.body)
    assert sent == {"model": MY_MODEL_TARGET, "prompt": "héllo", "temperature": 0, "max_tokens": 100, "n": 1}
    assert list(sent) == ["model", "prompt", "temperature", "max_tokens", "n"], "field order kept"
    assert result.set_headers["content-length"] == str(len(result.body))


def test_sse_usage_is_recorded_in_the_epp_metrics(hermetic: TestBed) -> None:
    # A real streamed response with usage, from a pod's simulator, cut into arbitrary chunks.
    request = urllib.request.Request(
        f"http://{hermetic.pods['pod-0'].ip}:8000/v1/completions",
        data=json.dumps(
            {
                "model": "base-model",
                "prompt": "one two three four five",
                "max_tokens": 3,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        stream = resp.read()
    usage_lines = [json.loads(line[len(b"data: ") :]) for line in stream.split(b"\n") if b'"usage"' in line]
    usage = usage_lines[-1]["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] == 3
    chunks = [stream[i : i + 37] for i in range(0, len(stream), 37)]

    result = hermetic.route_and_respond(MY_MODEL, chunks)
    assert result.status == 200, result.message

    text = hermetic.epp.metrics_text()
    labels = {"model_name": MY_MODEL, "target_model_name": MY_MODEL_TARGET}
    metrics = hermetic.cluster.generation.request_metrics  # inference_model / inference_objective
    assert sample(text, f"{metrics}_input_tokens_sum", **labels) == usage["prompt_tokens"]
    assert sample(text, f"{metrics}_input_tokens_count", **labels) == 1
    assert sample(text, f"{metrics}_output_tokens_sum", **labels) == 3
    assert sample(text, f"{metrics}_request_total", **labels) == 1
    assert sample(text, f"{metrics}_response_sizes_sum", **labels) == len(stream)


def test_bodyless_get_is_routed_to_some_pod(hermetic: TestBed) -> None:
    result = hermetic.route(None, bodyless=True)
    assert result.status == 200, result.message
    assert result.endpoint == result.header_endpoint
    assert hermetic.pod_for_endpoint(result.endpoint) in PODS
    assert result.body is None


def test_invalid_json_is_rejected_with_400_and_a_readable_message(hermetic: TestBed) -> None:
    result = hermetic.route(None, body=b"no healthy upstream")
    assert result.status == 400
    error = json.loads(result.error_body)["error"]
    assert error["message"].startswith("invalid JSON request body"), error
    assert "\n" not in error["message"]
    assert result.message == error["message"], "the client summarises the readable message"


@pytest.mark.api_generation("v1alpha2")  # a v1 pool passes any model through (TestBed.assert_not_declared)
def test_unknown_model_is_rejected_with_404(hermetic: TestBed) -> None:
    result = hermetic.route("no-such-model")
    assert result.status == 404
    assert "no-such-model" in json.loads(result.error_body)["error"]["message"]


def test_no_ready_pod_is_rejected_with_503(hermetic: TestBed) -> None:
    for pod in PODS:
        hermetic.pod_unready(pod)
        hermetic.eventually_consistent()
    assert hermetic.datastore_pods() == {}
    for result in (hermetic.route(MY_MODEL), hermetic.route(DIRECT), hermetic.route(None, bodyless=True)):
        assert result.status == 503, result
        assert "no ready endpoints" in json.loads(result.error_body)["error"]["message"]

    hermetic.pod_ready("pod-2")  # and one pod coming back is enough
    hermetic.eventually_consistent()
    assert hermetic.routed_pod(MY_MODEL) == "pod-2"
