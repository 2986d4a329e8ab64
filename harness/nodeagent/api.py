"""The agent's writes to the API server: pod status, the final delete, events (asyncio, aiohttp).

A kubelet patches the status subresource with the pod's UID in the patch (a precondition: a pod
deleted and re-created under the same name is never written with the old one's status), and ends a
graceful deletion with a delete of grace period 0 with a UID precondition. A pod that is gone (404,
or a UID that no longer matches) raises ``PodGone``: the agent stops caring about it. Connection
errors and 5xx answers are retried with a short backoff (the API server restarting), for a while.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp

from epp.k8s.config import KubeConfig
from harness.nodeagent.status import rfc3339

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]

STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
USER_AGENT: Final = "epp-harness-node-agent/0.1"
_RETRIES: Final = 8
_RETRY_DELAY: Final = 0.1
_TIMEOUT: Final = 30.0


class PodGone(RuntimeError):
    """The pod (this UID of it) no longer exists."""


class ApiFailed(RuntimeError):
    """The API server refused a write for a reason retrying will not fix."""


class PodApi:
    def __init__(self, config: KubeConfig) -> None:
        self._config = config
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def patch_status(self, namespace: str, name: str, uid: str, status: JsonObject) -> JsonObject:
        body = {"metadata": {"uid": uid}, "status": status}
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
        return await self._send("PATCH", path, body, content_type=STRATEGIC_MERGE_PATCH, uid=uid)

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's last word on a terminated pod: delete it now (grace 0), if it is still this UID."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                "preconditions": {"uid": uid}}  # fmt: skip
        await self._send("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body, uid=uid)

    async def request_token(
        self, namespace: str, service_account: str, pod: Mapping[str, Any], expiration_seconds: int
    ) -> JsonObject:
        """A TokenRequest as a kubelet makes it for a projected token: bound to the pod (invalid once
        the pod is deleted), the API server's default audience. Returns the TokenRequest's status."""
        meta = pod.get("metadata") or {}
        bound = {"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"), "uid": meta.get("uid")}
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_seconds, "boundObjectRef": bound},
        }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
        answer = await self._send("POST", path, body)
        return dict(answer.get("status") or {})

    async def get_configmap(self, namespace: str, name: str) -> JsonObject:
        return await self._send("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}", None)

    async def event(
        self, pod: Mapping[str, Any], node: str, kind: str, reason: str, message: str, field_path: str = ""
    ) -> None:
        """Record a core/v1 Event on the pod (best effort: a namespace going away refuses it)."""
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace", ""))
        now = datetime.now(UTC)
        involved: JsonObject = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace,
                                "name": meta.get("name"), "uid": meta.get("uid")}  # fmt: skip
        if field_path:
            involved["fieldPath"] = field_path
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name')}.{secrets.token_hex(8)}", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": "kubelet", "host": node},
            "firstTimestamp": rfc3339(now),
            "lastTimestamp": rfc3339(now),
            "count": 1,
            "reportingComponent": "kubelet",
            "reportingInstance": node,
        }
        try:
            await self._send("POST", f"/api/v1/namespaces/{namespace}/events", body, retries=1)
        except (ApiFailed, PodGone, aiohttp.ClientError, TimeoutError) as exc:
            log.debug("event %s on %s/%s not recorded: %s", reason, namespace, meta.get("name"), exc)

    async def _send(
        self,
        method: str,
        path: str,
        body: JsonObject | None,
        *,
        content_type: str = "application/json",
        uid: str | None = None,
        retries: int = _RETRIES,
    ) -> JsonObject:
        url = self._config.server + path
        headers = {"Content-Type": content_type, "Accept": "application/json", "User-Agent": USER_AGENT}
        auth = self._config.authorization()
        if auth:
            headers["Authorization"] = auth
        extra: dict[str, Any] = {}
        if self._config.tls_server_name:
            extra["server_hostname"] = self._config.tls_server_name
        delay = _RETRY_DELAY
        for attempt in range(retries):
            try:
                async with self._session_get().request(
                    method, url, data=None if body is None else json.dumps(body), headers=headers,
                    timeout=aiohttp.ClientTimeout(total=_TIMEOUT), **extra,
                ) as response:  # fmt: skip
                    raw = await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                if attempt + 1 == retries:
                    raise
                log.warning("%s %s: %r; retrying", method, path, exc)
            else:
                answer = _json(raw)
                if status < 300:
                    return answer
                if status == 404 or (uid is not None and _uid_mismatch(status, answer)):
                    raise PodGone(f"{method} {path}: {status} {answer.get('message', '')}")
                if status < 500 and status != 429:
                    raise ApiFailed(f"{method} {path}: {status} {answer.get('message', '')}")
                if attempt + 1 == retries:
                    raise ApiFailed(f"{method} {path}: {status} {answer.get('message', '')}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    def _session_get(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._config.ssl_context or True, limit=32)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session


def _json(raw: bytes) -> JsonObject:
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {"message": raw[:200].decode(errors="replace")}
    return data if isinstance(data, dict) else {}


def _uid_mismatch(status: int, answer: Mapping[str, Any]) -> bool:
    """A UID precondition failed (409 for delete) or a UID patch hit another pod (422/409 on uid)."""
    message = str(answer.get("message", "")).lower()
    return status in (409, 422) and ("uid" in message or "precondition" in message)
