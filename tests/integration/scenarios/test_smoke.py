"""The shortest path through every layer: API objects in, a routed request out."""

from __future__ import annotations

from harness.beds.testbed import TestBed


def test_pool_pod_model_then_a_request_is_routed(testbed: TestBed) -> None:
    testbed.apply_pool()
    testbed.apply_model("chat", "chat", criticality="Critical")
    pod = testbed.add_pod("p1")
    testbed.start_epp()
    testbed.eventually_consistent()
    result = testbed.route("chat")
    assert result.status == 200, result.message
    assert result.endpoint == f"{pod.ip}:8000"
    assert testbed.epp.health() == "SERVING"
