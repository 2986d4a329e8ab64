"""Container probes as a kubelet runs them: httpGet, tcpSocket and grpc, against the pod's address.

``parse`` reads a probe from a container spec (defaults as the API documents them: period 10 s,
timeout 1 s, success threshold 1, failure threshold 3); ``check`` runs it once. A kubelet's probe
period cannot go below 1 s; tests that flip readiness often put the annotation
``epp-harness/probe-period-seconds`` (e.g. ``"0.1"``) on the pod to probe faster — a harness knob with
no kubelet counterpart, documented as such. ``exec`` probes cannot run here (there is no container
filesystem): they always fail, with a message saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import aiohttp

PROBE_PERIOD_ANNOTATION: Final = "epp-harness/probe-period-seconds"

Kind = Literal["http", "tcp", "grpc", "exec"]


class ProbeConfigError(ValueError):
    """A probe that names a port the container does not declare, or has no handler."""


@dataclass(frozen=True)
class Probe:
    kind: Kind
    port: int
    path: str = "/"
    scheme: str = "HTTP"
    host: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    service: str = ""
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3


def parse(
    raw: Mapping[str, Any] | None, container: Mapping[str, Any], annotations: Mapping[str, str]
) -> Probe | None:
    """The container's probe (``readinessProbe``, ``livenessProbe`` or ``startupProbe`` value)."""
    if not raw:
        return None
    timing = {
        "initial_delay": float(raw.get("initialDelaySeconds") or 0),
        "period": float(raw.get("periodSeconds") or 10),
        "timeout": float(raw.get("timeoutSeconds") or 1),
        "success_threshold": int(raw.get("successThreshold") or 1),
        "failure_threshold": int(raw.get("failureThreshold") or 3),
    }
    override = annotations.get(PROBE_PERIOD_ANNOTATION)
    if override:
        try:
            timing["period"] = float(override)
        except ValueError as err:
            raise ProbeConfigError(f"annotation {PROBE_PERIOD_ANNOTATION}={override!r}: {err}") from err
    if "httpGet" in raw:
        action = raw["httpGet"] or {}
        headers = tuple((str(h["name"]), str(h.get("value", ""))) for h in action.get("httpHeaders") or ())
        return Probe(
            "http",
            _port(action.get("port"), container),
            path=str(action.get("path") or "/"),
            scheme=str(action.get("scheme") or "HTTP").upper(),
            host=action.get("host") or None,
            headers=headers,
            **timing,  # type: ignore[arg-type]
        )
    if "tcpSocket" in raw:
        action = raw["tcpSocket"] or {}
        return Probe("tcp", _port(action.get("port"), container), host=action.get("host") or None, **timing)  # type: ignore[arg-type]
    if "grpc" in raw:
        action = raw["grpc"] or {}
        return Probe("grpc", int(action["port"]), service=str(action.get("service") or ""), **timing)  # type: ignore[arg-type]
    if "exec" in raw:
        return Probe("exec", 0, **timing)  # type: ignore[arg-type]
    raise ProbeConfigError("a probe needs one of httpGet, tcpSocket, grpc or exec")


def _port(value: Any, container: Mapping[str, Any]) -> int:
    """A number, or the name of one of the container's ports."""
    if isinstance(value, int):
        return value
    text = str(value or "")
    if text.isdigit():
        return int(text)
    for port in container.get("ports") or ():
        if port.get("name") == text:
            return int(port["containerPort"])
    raise ProbeConfigError(f"the probe names port {text!r}, which the container does not declare")


@dataclass(frozen=True)
class Result:
    ok: bool
    detail: str = ""


class Prober:
    """Runs probes; one HTTP session for all of them (connections are not reused: as a kubelet)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def check(self, probe: Probe, pod_ip: str) -> Result:
        host = probe.host or pod_ip
        try:
            if probe.kind == "http":
                return await self._http(probe, host)
            if probe.kind == "tcp":
                return await _tcp(probe, host)
            if probe.kind == "grpc":
                return await _grpc(probe, host)
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            return Result(False, _describe(probe, host, exc))
        return Result(
            False, "exec probes are not supported by the harness node agent (no container filesystem)"
        )

    async def _http(self, probe: Probe, host: str) -> Result:
        if self._session is None:
            connector = aiohttp.TCPConnector(force_close=True, ssl=False)
            self._session = aiohttp.ClientSession(connector=connector)
        scheme = "https" if probe.scheme == "HTTPS" else "http"
        url = (
            f"{scheme}://{host}:{probe.port}{probe.path if probe.path.startswith('/') else '/' + probe.path}"
        )
        headers = {"User-Agent": "kube-probe/1.36", **dict(probe.headers)}
        timeout = aiohttp.ClientTimeout(total=probe.timeout)
        async with self._session.get(
            url, headers=headers, timeout=timeout, allow_redirects=False
        ) as response:
            await response.read()
            if 200 <= response.status < 400:
                return Result(True)
            return Result(False, f"HTTP probe failed with statuscode: {response.status}")


async def _tcp(probe: Probe, host: str) -> Result:
    _, writer = await asyncio.wait_for(asyncio.open_connection(host, probe.port), probe.timeout)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return Result(True)


async def _grpc(probe: Probe, host: str) -> Result:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(f"{host}:{probe.port}") as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=probe.service), timeout=probe.timeout
            )
        except grpc.aio.AioRpcError as exc:
            return Result(False, f"gRPC probe failed: {exc.code().name}")
    if reply.status == health_pb2.HealthCheckResponse.SERVING:
        return Result(True)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return Result(False, f"service unhealthy (responded with {status})")


def _describe(probe: Probe, host: str, exc: BaseException) -> str:
    target = f"{host}:{probe.port}"
    if isinstance(exc, TimeoutError):
        return f"{probe.kind} probe of {target} timed out after {probe.timeout:g}s"
    return f"{probe.kind} probe of {target} failed: {exc}"


__all__: Sequence[str] = ["PROBE_PERIOD_ANNOTATION", "Probe", "ProbeConfigError", "Prober", "Result", "parse"]
