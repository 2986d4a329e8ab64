"""The chart installed with ``helm install`` into the harness's cluster, run as a cluster runs it.

The real controller-manager makes the EPP pods from the chart's Deployment, the node agent runs
each as the Containerfile's ENTRYPOINT with the pod's projected ServiceAccount token, so every EPP
loads the in-cluster configuration and acts as the chart's ServiceAccount. Envoy's ext_proc cluster
lists the EPP pods' addresses and health-checks them (``harness.subject.chart_install``). Nothing here
starts an EPP by hand.

* Requests go end to end through Envoy, the chart-installed EPP and the simulated model servers.
* With ``replicas: 2`` both EPPs route; deleting one EPP pod under 32 requests in flight fails none
  (its drain reports NOT_SERVING, Envoy moves new streams to the other one, the streams it holds
  finish), the other serves everything, and the Deployment brings a new pod back: Ready, SERVING,
  and given streams by Envoy (which follows the Ready EPP pods, as a gateway follows EndpointSlices).
* Least privilege: with the EPP pod's own token, every write is 403 and every read the EPP needs
  in its namespace is 200 (the pool, and InferenceModels in v1alpha2 or InferenceObjectives and
  InferenceModelRewrites in v1); its namespace only.

The chart's pool is of the session's API generation (``--crd-release``), as are the example's models.

With the container tier on (``--containers``), the EPP pods are the image we ship (built from this
checkout's Containerfile, ``epp_image``) run by the node agent as real containers, with resource
limits, and every test here runs against them; one more test checks that they are containers as
the chart asks for them (non-root, read-only root, no capabilities, the projected token mounted,
the limits in their cgroups).
"""

from __future__ import annotations

import json
import os
import secrets
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.base.eventually import eventually
from harness.cluster.container_engine import DockerCommandError, DockerEngine
from harness.cluster.controlplane import ClusterAccess
from harness.cluster.releases import MODEL_KINDS_GROUP, MODEL_KINDS_VERSION, session_generation
from harness.dataplane.closed_loop import ClosedLoopLoad
from harness.plugin.container_fixtures import containers_enabled
from harness.scenarios.support import served_by
from harness.subject.chart_install import BASE_MODEL, METRICS_PORT, ChartInstall, ChartOptions, pod_ip
from harness.subject.epp_probe import health, metrics_text

pytestmark = pytest.mark.e2e

IN_FLIGHT = 32
TIMEOUT_S = 120.0
# What a client may see while the EPP learns the models and pods (404, 503): never after that.
STARTING = (openai.NotFoundError, openai.InternalServerError)
HEALTH_PORT = 9003  # the chart's gRPC health port
MODEL_KINDS_PATH = f"/apis/{MODEL_KINDS_GROUP}/{MODEL_KINDS_VERSION}"
# An object of each model kind the example applies (``Generation.example_manifest``).
EXAMPLE_MODEL_OBJECTS = {
    "inferencemodels": "llama",
    "inferencemodelrewrites": "food-review",
    "inferenceobjectives": "premium",
}


# The EPP pods' resources when they are containers (the limits end up in their cgroups).
CONTAINER_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"cpu": "1", "memory": "512Mi"},
}
MEMORY_LIMIT = 512 * 2**20


@pytest.fixture
def chart(
    control_plane: ClusterAccess, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[ChartInstall]:
    options = ChartOptions(replicas=2)
    if containers_enabled(request.config):  # the image we ship, as containers
        image = request.getfixturevalue("epp_image")
        options = ChartOptions(replicas=2, epp_image=image.tag, epp_resources=CONTAINER_RESOURCES)
    with ChartInstall(control_plane, namespace, tmp_path / "chart", options) as install:
        yield install


def openai_client(chart: ChartInstall) -> openai.OpenAI:
    return openai.OpenAI(base_url=chart.base_url, api_key="unused", max_retries=0, timeout=60.0)


def routed_by(pod: dict[str, Any]) -> float:
    """How many requests this EPP pod has routed (its own `inference_model_request_total`, in v1
    `inference_objective_request_total`)."""
    text = metrics_text(f"http://{pod_ip(pod)}:{METRICS_PORT}")
    family_name = f"{session_generation().request_metrics}_request"
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == family_name
        for sample in family.samples
        if sample.name == f"{family_name}_total"
    )


def test_requests_are_routed_through_envoy_by_the_chart_installed_epp(chart: ChartInstall) -> None:
    pods = chart.serving_epp_pods()
    assert {p["spec"]["serviceAccountName"] for p in pods} == {chart.epp_name}
    servers = {f"{pod_ip(p)}:8000" for p in chart.pods("app=vllm-llama3-8b-instruct")}
    client = openai_client(chart)
    try:

        def first() -> None:
            raw = client.completions.with_raw_response.create(model=BASE_MODEL, prompt="hi", max_tokens=4)
            assert served_by(raw.headers) in servers

        eventually(first, timeout=TIMEOUT_S, retry_on=STARTING, message="the first routed request")
        chat = client.chat.completions.with_raw_response.create(
            model="food-review", messages=[{"role": "user", "content": "Review: great tacos."}], max_tokens=8
        )
        assert served_by(chat.headers) in servers
        parsed = chat.parse()
        assert parsed.model in {"food-review-1", "food-review-2"}  # the adapter the EPP picked (70/30)
        assert parsed.choices[0].message.content
    finally:
        client.close()
    assert sum(routed_by(p) for p in pods) >= 2, "the EPP pods counted what they routed"


def routed_or_gone(pod: dict[str, Any]) -> float | None:
    """`routed_by`, or None once the pod's process has exited (its metrics port refuses)."""
    try:
        return routed_by(pod)
    except OSError:
        return None


def health_or_gone(pod: dict[str, Any]) -> str | None:
    """The EPP pod's gRPC health (SERVING / NOT_SERVING), or None once its process has exited."""
    try:
        return health(f"{pod_ip(pod)}:{HEALTH_PORT}", "inference-extension")
    except grpc.RpcError:
        return None


def short_request(client: int) -> dict[str, Any]:
    return {"model": BASE_MODEL, "prompt": f"client {client} {secrets.token_hex(4)}", "max_tokens": 60}


def test_two_replicas_serve_and_deleting_one_under_load_fails_no_request(chart: ChartInstall) -> None:
    first, second = sorted(chart.serving_epp_pods(), key=lambda p: str(p["metadata"]["name"]))[:2]
    url = f"{chart.base_url}/completions"

    def served(load: ClosedLoopLoad, since: float) -> int:
        return sum(1 for o in load.outcomes(since) if o.ok)

    def steady(load: ClosedLoopLoad, since: float, count: int) -> None:
        def enough() -> None:
            assert served(load, since) >= count, f"{served(load, since)} requests served"

        eventually(enough, timeout=TIMEOUT_S, message=f"{count} requests served")

    client = openai_client(chart)
    try:
        eventually(
            lambda: client.completions.create(model=BASE_MODEL, prompt="warm", max_tokens=1),
            timeout=TIMEOUT_S, retry_on=STARTING, message="routable",
        )  # fmt: skip
    finally:
        client.close()
    with ClosedLoopLoad(url, short_request, concurrency=IN_FLIGHT) as load:
        steady(load, 0.0, 2 * IN_FLIGHT)

        def both_route() -> None:
            assert routed_by(first) > 0, "Envoy spreads streams over both"
            assert routed_by(second) > 0, "Envoy spreads streams over both"

        eventually(both_route, timeout=TIMEOUT_S, message="both EPP pods route")
        name = first["metadata"]["name"]
        chart.kubectl("delete", "pod", name, "--wait=false")

        def replaced() -> None:
            names = [p["metadata"]["name"] for p in chart.epp_pods()]
            assert name not in names, f"{name} is still there (draining)"
            assert len(chart.serving_epp_pods()) == 2, f"EPP pods now: {names}"

        def only_the_other_routes() -> None:
            """A window of IN_FLIGHT requests in which the deleted (draining) replica routed none."""
            drained, other = routed_or_gone(first), routed_by(second)
            assert drained is not None, "the deleted replica exited before such a window was seen"
            # Its drain says so first: a replica that only refused new streams once its shutdown
            # delay was over would also end up with such a window, without Envoy being told.
            assert health_or_gone(first) == "NOT_SERVING", "the deleted replica's health is not NOT_SERVING"
            steady(load, time.monotonic(), IN_FLIGHT)
            assert routed_or_gone(first) in (None, drained), "the deleted replica still gets streams"
            assert routed_by(second) > other, "the remaining replica routes"

        eventually(only_the_other_routes, timeout=TIMEOUT_S, message="the draining replica gets no streams")
        eventually(replaced, timeout=TIMEOUT_S, message="the pod gone and a new one Ready")
        new = next(p for p in chart.serving_epp_pods() if p["metadata"]["name"] != second["metadata"]["name"])
        assert health(f"{pod_ip(new)}:{HEALTH_PORT}", "inference-extension") == "SERVING"

        def new_one_routes() -> None:
            assert routed_by(new) > 0, "Envoy sends the replacement pod streams"

        eventually(new_one_routes, timeout=TIMEOUT_S, message="the replacement routes")
        steady(load, time.monotonic(), 2 * IN_FLIGHT)
    failures = load.failures()
    assert failures == [], f"{len(failures)} of {len(load.outcomes())} failed, e.g. {failures[0].error}"


# ---------------------------------------------------------------------- least privilege


def _agent_pods(access: ClusterAccess) -> list[dict[str, Any]]:
    assert access.node_agent_url, "the plane runs a node agent"
    with urllib.request.urlopen(f"{access.node_agent_url}/debug/pods", timeout=10) as response:
        answer: Any = json.load(response)
    return list(answer["pods"] if isinstance(answer, dict) else answer)


def epp_token(chart: ChartInstall) -> str:
    """The token the node agent projected into an EPP pod: what that EPP authenticates with."""
    pod = chart.serving_epp_pods()[0]
    run = next(p for p in _agent_pods(chart.access) if p["uid"] == pod["metadata"]["uid"])
    # <container>.serviceaccount for a process, <container>.<volume> (kube-api-access-*) for a container
    return next(Path(run["workdir"]).glob("epp.*/token")).read_text().strip()


def status_as(access: ClusterAccess, token: str, method: str, path: str, body: Any = None) -> int:
    context = ssl.create_default_context(cafile=str(access.ca_cert_path))
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/merge-patch+json" if method == "PATCH" else "application/json"
    request = urllib.request.Request(access.server_url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_the_epp_service_account_reads_its_namespace_and_writes_nothing(chart: ChartInstall) -> None:
    token = epp_token(chart)
    ns, pool = chart.namespace, chart.options.release
    generation = session_generation()
    pod = chart.serving_epp_pods()[0]["metadata"]["name"]
    pods = f"/api/v1/namespaces/{ns}/pods"
    pools = f"/apis/{generation.pool_api_version}/namespaces/{ns}/inferencepools"
    reads = {
        "list pods": ("GET", pods),
        "get pod": ("GET", f"{pods}/{pod}"),
        "watch pods": ("GET", f"{pods}?watch=1&timeoutSeconds=1"),
        "list inferencepools": ("GET", pools),
        "get inferencepool": ("GET", f"{pools}/{pool}"),
        "watch inferencepools": ("GET", f"{pools}?watch=1&timeoutSeconds=1"),
    }
    new_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "intruder"},
               "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}  # fmt: skip
    label = {"metadata": {"labels": {"touched": "yes"}}}
    writes = {
        "create pod": ("POST", pods, new_pod),
        "update pod": ("PUT", f"{pods}/{pod}", chart.serving_epp_pods()[0]),
        "patch pod": ("PATCH", f"{pods}/{pod}", label),
        "delete pod": ("DELETE", f"{pods}/{pod}", None),
        "patch pod status": ("PATCH", f"{pods}/{pod}/status", {"status": {"phase": "Failed"}}),
        "patch inferencepool": ("PATCH", f"{pools}/{pool}", label),
        "patch inferencepool status": ("PATCH", f"{pools}/{pool}/status", {"status": {}}),
        "delete inferencepool": ("DELETE", f"{pools}/{pool}", None),
        "list pods in another namespace": ("GET", "/api/v1/namespaces/default/pods", None),
        "list nodes (cluster-scoped)": ("GET", "/api/v1/nodes", None),
        "list secrets": ("GET", f"/api/v1/namespaces/{ns}/secrets", None),
        "list leases (no HA mode)": ("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", None),
    }
    for plural in generation.model_plurals:
        objects, name = f"{MODEL_KINDS_PATH}/namespaces/{ns}/{plural}", EXAMPLE_MODEL_OBJECTS[plural]
        reads[f"list {plural}"] = ("GET", objects)
        reads[f"get {plural}"] = ("GET", f"{objects}/{name}")
        reads[f"watch {plural}"] = ("GET", f"{objects}?watch=1&timeoutSeconds=1")
        writes[f"patch {plural}"] = ("PATCH", f"{objects}/{name}", label)
        writes[f"patch {plural} status"] = ("PATCH", f"{objects}/{name}/status", {"status": {}})
        writes[f"delete {plural}"] = ("DELETE", f"{objects}/{name}", None)
    got_reads = {what: status_as(chart.access, token, m, p) for what, (m, p) in reads.items()}
    got_writes = {what: status_as(chart.access, token, m, p, b) for what, (m, p, b) in writes.items()}
    assert got_reads == dict.fromkeys(reads, 200)
    assert got_writes == dict.fromkeys(writes, 403)
    # The token is the pod's own and it works: the EPP pods still route (nothing was changed).
    assert len(chart.serving_epp_pods()) == chart.options.replicas


# ---------------------------------------------------------------------- the image we ship, as containers


def _status_fields(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


@pytest.mark.containers
def test_the_epp_pods_are_the_image_we_ship_as_the_chart_asks_for_them(
    chart: ChartInstall, container_engine: DockerEngine
) -> None:
    image_id = json.loads(container_engine.docker("image", "inspect", chart.options.epp_image))[0]["Id"]
    pods = chart.serving_epp_pods()
    assert len(pods) == 2
    for pod in pods:
        (status,) = pod["status"]["containerStatuses"]
        assert status["imageID"] == f"docker://{image_id}", status
        assert status["containerID"].startswith("docker://"), status
        container_id = status["containerID"].removeprefix("docker://")
        details = json.loads(container_engine.docker("inspect", container_id))[0]
        host = details["HostConfig"]
        assert host["NetworkMode"] == "host"
        assert host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"]
        assert "no-new-privileges" in host["SecurityOpt"]
        assert host["Memory"] == MEMORY_LIMIT
        assert host["CpuQuota"] == 100_000, "limits.cpu 1 as a CFS quota over 100 ms"
        assert set(host["Tmpfs"]) == {"/tmp"}, "the chart's in-memory emptyDir"
        mounts = {m["Destination"]: m for m in details["Mounts"]}
        token_mount = mounts["/var/run/secrets/kubernetes.io/serviceaccount"]
        assert token_mount["RW"] is False, "the projected token is mounted read-only"
        # The kernel's view: the image's user, no capabilities, the cgroup limit, its own pid namespace.
        pid = int(details["State"]["Pid"])
        fields = _status_fields(pid)
        assert fields["Uid"].split() == ["65532"] * 4, fields["Uid"]
        assert int(fields["CapEff"], 16) == 0
        assert fields["NoNewPrivs"] == "1"
        cgroup = Path("/sys/fs/cgroup/memory") / container_engine.cgroup_parent / container_id
        assert int((cgroup / "memory.limit_in_bytes").read_text()) == MEMORY_LIMIT
        assert os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
        # The EPP found its in-cluster configuration at the usual path (no $EPP_SERVICE_ACCOUNT_DIR).
        env = dict(e.partition("=")[::2] for e in details["Config"]["Env"])
        assert "EPP_SERVICE_ACCOUNT_DIR" not in env
        assert health(f"{pod_ip(pod)}:{HEALTH_PORT}", "inference-extension") == "SERVING"
        with pytest.raises(DockerCommandError, match="Read-only file system"):
            container_engine.docker("exec", container_id, "python3", "-c", "open('/written-by-the-epp', 'w')")
