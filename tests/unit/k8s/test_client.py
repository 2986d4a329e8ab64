"""KubeClient against the fake API server: list paging and selectors, watch streaming, typed errors."""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
from pathlib import Path

import pytest
from aiohttp import web

from epp.api import v1alpha2
from epp.k8s import client as client_module
from epp.k8s.client import PODS, KubeClient, Resource, WatchEvent
from epp.k8s.config import KubeConfig
from epp.k8s.errors import ApiError, GoneError, KubeConnectionError, WatchStalledError
from harness.cluster.builders import PodBuilder, PoolBuilder
from harness.cluster.certs import TinyCA

from .fake_apiserver import POD_PATH, POOL_PATH, FakeApiServer
from .support import drain, plain_config, run

INFERENCE_POOLS = Resource(v1alpha2.GROUP, v1alpha2.VERSION, v1alpha2.POOLS)


def test_resource_paths() -> None:
    assert PODS.path("ns1") == POD_PATH
    assert INFERENCE_POOLS.path("ns1") == POOL_PATH
    assert PODS.path("") == "/api/v1/pods", "no namespace: every namespace (the node agent's watch)"


def test_list_follows_pages_and_passes_selectors() -> None:
    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url, token="t0k")) as client:
            for i in range(5):
                server.upsert(POD_PATH, PodBuilder(f"p{i}").namespace("ns1").labels(app="vllm").build())
            server.upsert(POD_PATH, PodBuilder("other").namespace("ns1").labels(app="x").build())

            items, rv = await client.list(PODS, "ns1", label_selector="app=vllm", page_size=2)

            assert [i["metadata"]["name"] for i in items] == [f"p{i}" for i in range(5)]
            assert rv == str(server.rv)
            lists = server.lists(POD_PATH)
            assert len(lists) == 3
            assert all(r.query["labelSelector"] == "app=vllm" for r in lists)
            assert [r.query.get("continue") for r in lists] == [None, "2", "4"]
            assert lists[0].headers["Authorization"] == "Bearer t0k"

    run(main)


def test_field_selector_scopes_the_list() -> None:
    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            for name in ("pool", "other"):
                server.upsert(POOL_PATH, PoolBuilder(name).namespace("ns1").build())
            items, _ = await client.list(INFERENCE_POOLS, "ns1", field_selector="metadata.name=pool")
            assert [i["metadata"]["name"] for i in items] == ["pool"]
            assert "Authorization" not in server.requests[0].headers

    run(main)


@pytest.mark.parametrize(
    ("fault", "error", "status", "reason", "message"),
    [
        pytest.param(
            "403", ApiError, 403, "Forbidden", 'pods is forbidden: User "x" cannot list', id="forbidden"
        ),
        pytest.param("500", ApiError, 500, "InternalError", "scripted failure", id="server-error"),
    ],
)
def test_list_failure_is_a_typed_error(
    fault: str, error: type[ApiError], status: int, reason: str, message: str
) -> None:
    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            server.list_faults.append(fault)
            with pytest.raises(error) as caught:
                await client.list(PODS, "ns1")
            # The Status body's reason and message, word for word: what the EPP's log says.
            assert (caught.value.status, caught.value.reason, caught.value.message) == (
                status,
                reason,
                message,
            )
            assert str(caught.value) == f"{status} {reason}: {message}"

    run(main)


def test_watch_streams_events_from_a_resource_version() -> None:
    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            server.upsert(POD_PATH, PodBuilder("p1").namespace("ns1").build())
            _, rv = await client.list(PODS, "ns1")
            server.upsert(POD_PATH, PodBuilder("p2").namespace("ns1").build())
            server.delete(POD_PATH, "p1")
            mark = server.bookmark(POD_PATH)

            seen: list[WatchEvent] = []
            stream = client.watch(PODS, "ns1", rv, timeout_seconds=42)
            async with contextlib.aclosing(stream):
                async for event in stream:
                    seen.append(event)
                    if event.type == "BOOKMARK":
                        break

            assert [(e.type, e.object["metadata"].get("name")) for e in seen] == [
                ("ADDED", "p2"),
                ("DELETED", "p1"),
                ("BOOKMARK", None),
            ]
            assert seen[-1].resource_version == str(mark)
            query = server.watches(POD_PATH)[0].query
            assert query["resourceVersion"] == rv
            assert query["allowWatchBookmarks"] == "true"
            assert query["timeoutSeconds"] == "42"

    run(main)


@pytest.mark.parametrize(
    "fault", [pytest.param("gone", id="http-410"), pytest.param("gone-event", id="error-event-410")]
)
def test_watch_gone_is_gone_error(fault: str) -> None:
    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            server.watch_faults.append(fault)
            with pytest.raises(GoneError) as caught:
                await drain(client.watch(PODS, "ns1", "1"))
            assert caught.value.status == 410

    run(main)


def test_dropped_watch_is_a_connection_error() -> None:
    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            server.upsert(POD_PATH, PodBuilder("p1").namespace("ns1").build())
            server.upsert(POD_PATH, PodBuilder("p2").namespace("ns1").build())
            server.watch_faults.append("drop:1")
            seen: list[WatchEvent] = []
            with pytest.raises(KubeConnectionError):
                await drain(client.watch(PODS, "ns1", "0"), seen)
            assert [e.object["metadata"]["name"] for e in seen] == ["p1"]

    run(main)


def test_connection_refused_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connections are refused

        async def main() -> None:
            async with KubeClient(plain_config(f"http://127.0.0.1:{port}")) as client:
                with pytest.raises(KubeConnectionError):
                    await client.list(PODS, "ns1")

        run(main)


def test_a_watch_that_reads_nothing_for_the_idle_timeout_is_stalled() -> None:
    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            server.watch_faults.append("hang")
            with pytest.raises(WatchStalledError, match=r"nothing read for 0\.3s"):
                await drain(client.watch(PODS, "ns1", "1", timeout_seconds=1, idle_timeout=0.3))

    run(main)


def test_every_request_gets_a_connection_of_its_own() -> None:
    """No keep-alive pool: a pooled connection could be half-open (client.py's docstring)."""

    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            for _ in range(3):
                await client.list(PODS, "ns1")
            ports = {r.peer_port for r in server.requests}
            assert len(ports) == 3, ports

    run(main)


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        pytest.param(
            {"reason": "Expired", "message": "too old resource version"},
            410,
            (GoneError, 410, "Expired", "too old resource version"),
            id="gone-with-reason",
        ),
        pytest.param({}, 410, (GoneError, 410, "Gone", ""), id="gone-without-reason"),
        pytest.param(
            {"reason": "Forbidden", "message": "no"}, 403, (ApiError, 403, "Forbidden", "no"), id="forbidden"
        ),
        pytest.param({"reason": None, "message": None}, 500, (ApiError, 500, "", ""), id="nulls-are-empty"),
    ],
)
def test_a_status_body_becomes_a_typed_error(
    status: dict[str, object], code: int, expected: tuple[type[ApiError], int, str, str]
) -> None:
    error = client_module._status_error(status, code)
    assert (type(error), error.status, error.reason, error.message) == expected


def test_an_error_event_without_a_code_is_a_500() -> None:
    with pytest.raises(ApiError) as caught:
        client_module._event(b'{"type": "ERROR", "object": {"reason": "InternalError", "message": "boom"}}')
    assert (caught.value.status, caught.value.reason, caught.value.message) == (500, "InternalError", "boom")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        pytest.param(b"{not json", "malformed line: b'{not json'", id="not-json"),
        pytest.param(b'{"type": "ADDED", "object": 3}', "malformed event", id="object-not-a-mapping"),
    ],
)
def test_a_malformed_watch_line_says_what_it_was(line: bytes, says: str) -> None:
    with pytest.raises(KubeConnectionError, match=re.escape(says)):
        client_module._event(line)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        pytest.param(b"<" + b"x" * 400, "line", id="not-json"),
        pytest.param(
            b'{"type": "ADDED", "object": 3, "pad": "' + b"x" * 400 + b'"}', "event", id="not-an-event"
        ),
    ],
)
def test_a_long_malformed_watch_line_is_quoted_to_its_first_200_bytes(line: bytes, says: str) -> None:
    """The text goes into the informer's log line: a proxy's whole error page would flood it."""
    with pytest.raises(KubeConnectionError) as caught:
        client_module._event(line)
    assert str(caught.value) == f"watch stream carried a malformed {says}: {line[:200]!r}"


def test_a_list_without_a_resource_version_is_watched_from_now() -> None:
    """An API server always sends the list's resourceVersion, but an aggregated API or a proxy may
    not: the watch then starts with no resourceVersion (from now), never from a made-up one."""

    async def main() -> None:
        answers = {POD_PATH: (200, "application/json", b'{"items": [], "metadata": {}}')}
        async with CannedServer(answers) as server, KubeClient(plain_config(server.url)) as client:
            assert await client.list(PODS, "ns1") == ([], "")

    run(main)


def test_an_event_without_a_type_has_an_empty_type() -> None:
    assert client_module._event(b'{"object": {"kind": "Pod"}}').type == ""


def test_every_request_says_who_it_is_and_what_it_accepts() -> None:
    """Audit logs and API priority-and-fairness see the EPP by its User-Agent; writes are JSON."""

    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            await client.list(PODS, "ns1")
            server.watch_faults.append("close")
            await drain(client.watch(PODS, "ns1", "1", timeout_seconds=1))
            leases = "/apis/coordination.k8s.io/v1/namespaces/ns1/leases"
            created = await client.create_object(leases, {"metadata": {"name": "l1"}, "spec": {}})
            await client.replace_object(f"{leases}/l1", created)
            assert [r.verb for r in server.requests] == ["list", "watch", "create", "replace"]
            for request in server.requests:
                assert request.headers["Accept"] == "application/json"
                assert request.headers["User-Agent"] == "epp/0.1 (inference endpoint picker)"
                assert "Authorization" not in request.headers
            assert [r.headers.get("Content-Type") for r in server.requests[2:]] == ["application/json"] * 2
            assert "Content-Length" not in server.requests[0].headers  # a GET carries no body
            assert server.requests[0].query == {"limit": "500"}
            assert server.requests[1].query == {
                "watch": "true",
                "resourceVersion": "1",
                "allowWatchBookmarks": "true",
                "timeoutSeconds": "1",
            }

    run(main)


def test_a_watch_lasts_at_least_a_second_and_stalls_after_twice_its_timeout() -> None:
    """timeoutSeconds is whole seconds, at least 1 (0 would mean the server's own, much longer,
    default); with no idle limit given, a watch silent for twice its timeout is dead."""

    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url)) as client:
            server.watch_faults.append("hang")
            with pytest.raises(WatchStalledError, match=r"nothing read for 2s$"):
                await drain(client.watch(PODS, "ns1", "1", timeout_seconds=0))
            assert server.watches(POD_PATH)[0].query["timeoutSeconds"] == "1"

    run(main)


class CannedServer:
    """An HTTP server answering each path with a fixed status, content type and body."""

    def __init__(self, answers: dict[str, tuple[int, str, bytes]]) -> None:
        self.answers = answers
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> CannedServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        status, content_type, body = self.answers[request.path]
        if request.query.get("watch") == "true":
            resp = web.StreamResponse(status=status, headers={"Content-Type": content_type})
            await resp.prepare(request)
            await resp.write(body)
            await resp.write_eof()
            return resp
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})


LEASE = "/apis/coordination.k8s.io/v1/namespaces/ns1/leases/l1"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        pytest.param(b"<html>proxy error</html>", f"GET .*{LEASE}: response is not JSON$", id="not-json"),
        pytest.param(b"[1, 2]", f"GET .*{LEASE}: response is not a JSON object$", id="not-an-object"),
    ],
)
def test_a_response_that_is_not_a_json_object_is_a_connection_error(body: bytes, says: str) -> None:
    """A proxy's HTML page in place of the API server is not an object to act on: retried, never parsed."""

    async def main() -> None:
        answers = {LEASE: (200, "text/html", body)}
        async with CannedServer(answers) as server, KubeClient(plain_config(server.url)) as client:
            with pytest.raises(KubeConnectionError, match=says):
                await client.get_object(LEASE)

    run(main)


def test_an_error_without_a_status_body_takes_the_http_reason_and_only_404_is_absent() -> None:
    async def main() -> None:
        answers = {
            LEASE: (503, "text/plain", b"upstream connect error"),
            "/gone": (404, "text/plain", b"404 page not found"),
            "/bare": (599, "text/plain", b""),
        }
        async with CannedServer(answers) as server, KubeClient(plain_config(server.url)) as client:
            with pytest.raises(ApiError) as caught:
                await client.get_object(LEASE)
            assert (caught.value.status, caught.value.reason, caught.value.message) == (
                503,
                "Service Unavailable",
                "",
            )
            assert str(caught.value) == "503 Service Unavailable"  # no dangling ": " without a message
            with pytest.raises(ApiError) as caught:
                await client.get_object("/bare")
            assert str(caught.value) == "599"  # a status line without a reason phrase: nothing made up
            assert await client.get_object("/gone") is None

    run(main)


def test_a_watch_streams_a_last_event_without_its_newline_and_skips_blank_lines() -> None:
    """kube-apiserver ends each event with a newline, but a proxy may cut the last one's: it still counts."""
    events = (
        b'\n{"type": "ADDED", "object": {"metadata": {"name": "p1", "resourceVersion": "5"}}}\n'
        b"   \n"
        b'{"type": "MODIFIED", "object": {"metadata": {"name": "p1", "resourceVersion": "6"}}}'
    )

    async def main() -> None:
        seen: list[WatchEvent] = []
        answers = {POD_PATH: (200, "application/json", events)}
        async with CannedServer(answers) as server, KubeClient(plain_config(server.url)) as client:
            await drain(client.watch(PODS, "ns1", "4"), seen)
        assert [(e.type, e.resource_version) for e in seen] == [("ADDED", "5"), ("MODIFIED", "6")]

    run(main)


def test_a_watch_refused_with_a_status_is_an_api_error() -> None:
    body = b'{"kind": "Status", "code": 403, "reason": "Forbidden", "message": "cannot watch pods"}'

    async def main() -> None:
        answers = {POD_PATH: (403, "application/json", body)}
        async with CannedServer(answers) as server, KubeClient(plain_config(server.url)) as client:
            with pytest.raises(ApiError) as caught:
                await drain(client.watch(PODS, "ns1", "4"))
        assert str(caught.value) == "403 Forbidden: cannot watch pods"

    run(main)


def test_the_token_goes_with_every_request_a_watch_too() -> None:
    """A watch without the bearer token would get 401 from any real cluster: list, watch and the
    Lease's writes all carry it."""

    async def main() -> None:
        async with FakeApiServer() as server, KubeClient(plain_config(server.url, token="t0k")) as client:
            await client.list(PODS, "ns1")
            server.watch_faults.append("close")
            await drain(client.watch(PODS, "ns1", "1"))
            leases = "/apis/coordination.k8s.io/v1/namespaces/ns1/leases"
            await client.create_object(leases, {"metadata": {"name": "l1"}, "spec": {}})
            assert [(r.verb, r.headers.get("Authorization")) for r in server.requests] == [
                ("list", "Bearer t0k"),
                ("watch", "Bearer t0k"),
                ("create", "Bearer t0k"),
            ]
            assert server.requests[2].headers["Content-Type"] == "application/json"

    run(main)


def test_tls_server_name_is_the_name_the_certificate_is_checked_against(tmp_path: Path) -> None:
    """kubeconfig's `tls-server-name`: the API server is reached by address and its certificate
    names only `kubernetes.default` (as behind a tunnel or a load balancer): the client checks it
    against the configured name, and the list goes through."""
    ca = TinyCA()
    serving = ca.issue_serving(["kubernetes.default"], [])
    (tmp_path / "srv.crt").write_bytes(serving.cert_pem)
    (tmp_path / "srv.key").write_bytes(serving.key_pem)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "srv.crt", tmp_path / "srv.key")
    client_ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())

    async def main() -> None:
        async with FakeApiServer(ssl_context=server_ctx) as server:
            named = KubeConfig(
                server=server.url, ssl_context=client_ctx, tls_server_name="kubernetes.default"
            )
            async with KubeClient(named) as client:
                assert await client.list(PODS, "ns1") == ([], str(server.rv))
            # (Without the name the handshake fails, "IP address mismatch": what the mutant that drops
            # it sees. Not repeated here: the server's side of a failed handshake outlives the test.)

    run(main)
