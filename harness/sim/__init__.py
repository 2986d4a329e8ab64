"""OpenAI-compatible vLLM model-server simulator with the real vLLM ``/metrics`` names.

On a running loop: ``async with ModelServerSim("127.0.0.2", 8000, SimConfig(...)) as sim: ...``.
From sync code: ``handle = ModelServerSim("127.0.0.3").start_in_thread()`` ... ``handle.stop()``.
"""

from harness.sim._config import SimConfig
from harness.sim._engine import EngineState
from harness.sim._received import ReceivedRequest
from harness.sim._server import SERVED_BY_HEADER, ModelServerSim
from harness.sim._thread import SimThread

__all__ = ["SERVED_BY_HEADER", "EngineState", "ModelServerSim", "ReceivedRequest", "SimConfig", "SimThread"]
