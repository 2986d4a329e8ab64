"""A pod's projected ServiceAccount volume, written to a directory and kept fresh as a kubelet does.

A kubelet mounts ``token``, ``ca.crt`` and ``namespace`` at ``/var/run/secrets/kubernetes.io/
serviceaccount``: the token from a TokenRequest bound to the pod (so it dies with the pod; default
audience; ``expirationSeconds: 3607``), the CA from the namespace's ``kube-root-ca.crt`` ConfigMap
(published by the controller-manager's root-CA publisher). Its token manager requests a new token
once 80% of the old one's lifetime has passed and swaps the file, so a client must re-read it (the
EPP's ``epp.k8s.config.TokenFile`` does). There is no container filesystem here, so the files go to
a directory of the pod's working directory and the program is told where
(``$EPP_SERVICE_ACCOUNT_DIR`` for the EPP). Every file is replaced by an atomic rename: a reader sees
the old token or the new one, never half of one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Protocol

import aiohttp

from harness.nodeagent.api import ApiFailed, PodGone

log = logging.getLogger(__name__)

TOKEN_EXPIRATION_S: Final = 3607  # what a kubelet asks for (the API server's minimum is 600)
REFRESH_FRACTION: Final = 0.8  # a kubelet's token manager renews after 80% of the lifetime
ROOT_CA_CONFIGMAP: Final = "kube-root-ca.crt"
_RETRY_INITIAL_S: Final = 0.2
_RETRY_MAX_S: Final = 5.0
_FIRST_WRITE_TIMEOUT_S: Final = 30.0


class TokenApi(Protocol):
    """What the projection asks the API server (``harness.nodeagent.api.PodApi`` does it)."""

    async def request_token(
        self, namespace: str, service_account: str, pod: Mapping[str, Any], expiration_seconds: int
    ) -> dict[str, Any]: ...

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any]: ...


class ServiceAccountVolumeError(RuntimeError):
    """The token or the CA could not be obtained in time (the container cannot start)."""


class ProjectedServiceAccount:
    """``token``, ``ca.crt`` and ``namespace`` of ``pod`` in ``directory``; ``keep_fresh`` renews."""

    def __init__(
        self,
        api: TokenApi,
        pod: Mapping[str, Any],
        directory: Path,
        *,
        expiration_seconds: int = TOKEN_EXPIRATION_S,
        clock: Callable[[], float] = time.time,
        mode: int = 0o600,
    ) -> None:
        """``mode``: of every file (0600 for a program of the agent's own user; a container's volume
        gets the projected volume's ``defaultMode``, 0644, so the image's user can read it)."""
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        self._api = api
        self._pod = pod
        self.namespace = str(meta.get("namespace", ""))
        self.service_account = str(spec.get("serviceAccountName") or "default")
        self.directory = directory
        self._expiration_seconds = expiration_seconds
        self._clock = clock
        self._mode = mode
        self.refresh_at = 0.0  # wall-clock time of the next renewal
        self.renewals = 0  # tokens written after the first

    @property
    def token_path(self) -> Path:
        return self.directory / "token"

    async def write(self, within: float = _FIRST_WRITE_TIMEOUT_S) -> None:
        """The first write: CA, namespace and a token, retried while the API says "not yet" (the
        namespace's root-CA ConfigMap is published a moment after the namespace appears)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + within
        delay = _RETRY_INITIAL_S
        while True:
            try:
                configmap = await self._api.get_configmap(self.namespace, ROOT_CA_CONFIGMAP)
                ca = str((configmap.get("data") or {}).get("ca.crt", ""))
                if not ca:
                    raise ApiFailed(f"ConfigMap {self.namespace}/{ROOT_CA_CONFIGMAP} has no ca.crt")
                await self._renew()
                break
            except (ApiFailed, PodGone, aiohttp.ClientError, TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise ServiceAccountVolumeError(
                        f"projected service account token of {self.namespace}/{self.service_account}: {exc}"
                    ) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)
        _replace(self.directory / "ca.crt", ca, self._mode)
        _replace(self.directory / "namespace", self.namespace, self._mode)

    async def keep_fresh(self) -> None:
        """Renew the token at ``refresh_at``; a failed renewal is retried (the old token is still
        valid for the remaining 20% of its life). Runs until cancelled (the pod's end)."""
        delay = _RETRY_INITIAL_S
        while True:
            await asyncio.sleep(max(0.0, self.refresh_at - self._clock()))
            try:
                await self._renew()
                self.renewals += 1
                delay = _RETRY_INITIAL_S
            except (ApiFailed, PodGone, aiohttp.ClientError, TimeoutError) as exc:
                account = f"{self.namespace}/{self.service_account}"
                log.warning("renewing the token of %s failed: %r", account, exc)
                self.refresh_at = self._clock() + delay
                delay = min(delay * 2, _RETRY_MAX_S)

    async def _renew(self) -> None:
        issued = self._clock()
        status = await self._api.request_token(
            self.namespace, self.service_account, self._pod, self._expiration_seconds
        )
        token = str(status.get("token") or "")
        if not token:
            raise ApiFailed("the TokenRequest answer carries no token")
        expires = _expiry(status.get("expirationTimestamp"), issued + self._expiration_seconds)
        self.refresh_at = issued + REFRESH_FRACTION * max(0.0, expires - issued)
        _replace(self.token_path, token, self._mode)


def _expiry(stamp: Any, default: float) -> float:
    if not isinstance(stamp, str) or not stamp:
        return default
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


def _replace(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` by atomic rename, with ``mode``."""
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
        os.fchmod(file.fileno(), mode)
    os.replace(temporary, path)
