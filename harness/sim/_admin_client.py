"""``SimAdmin``: a test's handle on one simulator, over its admin port (``harness.sim._admin``).

The same calls work whether the simulator is a process the node agent runs for a pod or a thread in
the test process: tests only ever know an address, as a user knows a pod IP.

    sim = SimAdmin("127.0.3.7", 18000)
    sim.set_gauges(waiting=3, kv_cache=0.4)
    sim.set_healthy(False)            # readiness probes fail from now on
    sim.requests_by_model()           # {"base": 12, "lora-a": 3}
"""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Sequence
from typing import Any, Final

from harness.sim._engine import EngineState
from harness.sim._received import ReceivedRequest

DEFAULT_TIMEOUT: Final = 10.0


class SimAdminError(RuntimeError):
    """The admin listener answered with an error (the message is its own)."""


class SimAdmin:
    """Blocking calls to one simulator's admin listener; any thread."""

    def __init__(self, host: str, port: int, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.host = host
        self.port = port
        self._timeout = timeout

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"SimAdmin({self.address})"

    # ---- controls ------------------------------------------------------------------------------
    def set_gauges(self, **gauges: Any) -> None:
        """Pin reported gauges (``ModelServerSim.set_gauges`` keywords; sequences for the LoRA lists)."""
        body = {k: list(v) if isinstance(v, (tuple, list, set, frozenset)) else v for k, v in gauges.items()}
        self._call("PUT", "/admin/gauges", body)

    def clear_gauges(self) -> None:
        self._call("DELETE", "/admin/gauges")

    def set_healthy(self, healthy: bool) -> None:
        """``/health`` answers 200 (True) or 503 (False): what the pod's readiness probe sees."""
        self._call("PUT", "/admin/health", {"healthy": healthy})

    def black_hole(self, paths: Sequence[str]) -> None:
        """Requests to ``paths`` hang until lifted with ``black_hole(())``."""
        self._call("PUT", "/admin/black-hole", {"paths": list(paths)})

    # ---- readings ------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """``pid``, ``model``, ``adapters``, ``address`` (serving), ``healthy``, ``black_holed``."""
        info: dict[str, Any] = self._call("GET", "/admin/info")
        return info

    @property
    def pid(self) -> int:
        return int(self.info()["pid"])

    def requests_by_model(self) -> dict[str, int]:
        """Generation requests accepted so far, by the model name asked for (base or adapter)."""
        counts = self._call("GET", "/admin/requests")["by_model"]
        return {str(k): int(v) for k, v in counts.items()}

    def received_requests(self) -> list[ReceivedRequest]:
        """Every generation request as it arrived (headers with repeats, raw body), oldest first."""
        return [
            ReceivedRequest(
                str(r["method"]),
                str(r["path"]),
                tuple((str(k), str(v)) for k, v in r["headers"]),
                base64.b64decode(r["body"]),
                str(r.get("http_version", "1.1")),
            )
            for r in self._call("GET", "/admin/received")
        ]

    def state(self) -> EngineState:
        """The engine's real state (pins ignored)."""
        raw = self._call("GET", "/admin/state")
        return EngineState(
            waiting=int(raw["waiting"]),
            running=int(raw["running"]),
            kv_cache_usage=float(raw["kv_cache_usage"]),
            running_loras=tuple(raw["running_loras"]),
            waiting_loras=tuple(raw["waiting_loras"]),
            loaded_loras=tuple(raw["loaded_loras"]),
        )

    # ---- transport -----------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None) -> Any:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self._timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        finally:
            connection.close()
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = raw.decode(errors="replace")
        if response.status != 200:
            message = answer.get("error") if isinstance(answer, dict) else answer
            raise SimAdminError(f"{method} {self.address}{path}: {response.status} {message}")
        return answer
