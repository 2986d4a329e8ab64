"""The simulator's admin listener, driven through ``SimAdmin`` as tests drive pods: over HTTP only."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from harness.sim import ADMIN_PORT_OFFSET, ModelServerSim, SimAdmin, SimAdminError, SimConfig, SimThread

from .scrape import gauges

CONFIG = SimConfig(model="base", lora_adapters=("a",), time_scale=0.001)


@pytest.fixture
def sim(address: str) -> Iterator[tuple[ModelServerSim, SimAdmin]]:
    server = ModelServerSim(address, config=CONFIG, admin_port=8000 + ADMIN_PORT_OFFSET)
    with SimThread(server):
        yield server, SimAdmin(address, 8000 + ADMIN_PORT_OFFSET)


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def complete(server: ModelServerSim, model: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{server.base_url}/v1/completions",
        data=json.dumps({"model": model, "prompt": "hi", "max_tokens": 1}).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


def test_info_names_the_process_and_its_model(sim: tuple[ModelServerSim, SimAdmin]) -> None:
    server, admin = sim
    info = admin.info()
    assert info["model"] == "base"
    assert info["adapters"] == ["a"]
    assert info["address"] == server.address
    assert admin.pid == info["pid"]


def test_pinned_gauges_show_on_metrics_and_clear(sim: tuple[ModelServerSim, SimAdmin]) -> None:
    server, admin = sim
    admin.set_gauges(waiting=7, kv_cache=0.5, running_loras=["a"], max_lora=3)
    pinned = gauges(get(f"{server.base_url}/metrics")[1].decode())
    assert (pinned.waiting, pinned.kv_cache) == (7, 0.5)
    assert pinned.running_loras == "a"
    admin.clear_gauges()
    assert gauges(get(f"{server.base_url}/metrics")[1].decode()).waiting == 0


def test_health_can_be_failed_and_restored(sim: tuple[ModelServerSim, SimAdmin]) -> None:
    server, admin = sim
    assert get(f"{server.base_url}/health")[0] == 200
    admin.set_healthy(False)
    assert get(f"{server.base_url}/health")[0] == 503
    assert admin.info()["healthy"] is False
    admin.set_healthy(True)
    assert get(f"{server.base_url}/health")[0] == 200


def test_black_holed_paths_hang_until_lifted_while_health_answers(
    sim: tuple[ModelServerSim, SimAdmin],
) -> None:
    server, admin = sim
    admin.black_hole(["/metrics"])
    answers: list[int] = []
    waiter = threading.Thread(target=lambda: answers.append(get(f"{server.base_url}/metrics", 30)[0]))
    waiter.start()
    try:
        assert get(f"{server.base_url}/health")[0] == 200, "only the black-holed path hangs"
        with pytest.raises(TimeoutError):
            urllib.request.urlopen(f"{server.base_url}/metrics", timeout=0.3)
        assert answers == [], "the held scrape has no answer yet"
    finally:
        admin.black_hole([])
        waiter.join(timeout=10)
    assert answers == [200], "lifted: the held request is answered"


def test_counters_and_received_requests_are_read_back(sim: tuple[ModelServerSim, SimAdmin]) -> None:
    server, admin = sim
    complete(server, "a", {"X-Twice": "one"})
    complete(server, "base")
    assert admin.requests_by_model() == {"a": 1, "base": 1}
    first, second = admin.received_requests()
    assert first.header_values("x-twice") == ["one"]
    assert json.loads(first.body)["model"] == "a"
    assert json.loads(second.body)["model"] == "base"
    state = admin.state()
    assert state.running == 0
    assert "a" in state.loaded_loras


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param("/admin/gauges", {"nope": 1}, id="unknown-gauge"),
        pytest.param("/admin/gauges", {"waiting": "three"}, id="not-a-number"),
        pytest.param("/admin/health", {"healthy": "yes"}, id="not-a-bool"),
        pytest.param("/admin/black-hole", {"paths": ["metrics"]}, id="relative-path"),
    ],
)
def test_bad_admin_input_is_a_400_with_a_message(
    sim: tuple[ModelServerSim, SimAdmin], path: str, body: dict[str, Any]
) -> None:
    _, admin = sim
    with pytest.raises(SimAdminError, match="400"):
        admin._call("PUT", path, body)


def test_admin_endpoints_are_not_on_the_serving_port(sim: tuple[ModelServerSim, SimAdmin]) -> None:
    """A client going through the gateway reaches the serving port only: no admin there."""
    server, _ = sim
    assert get(f"{server.base_url}/admin/info")[0] == 404
