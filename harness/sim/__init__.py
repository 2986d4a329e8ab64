"""OpenAI-compatible vLLM model-server simulator with the real vLLM ``/metrics`` names.

On a running loop: ``async with ModelServerSim("127.0.0.2", 8000, SimConfig(...)) as sim: ...``.
From sync code: ``with SimThread(ModelServerSim("127.0.0.3")) as handle: ...``.
As a process (what the node agent runs for a pod): ``python -m harness.sim --help``.
A test talks to a running simulator through its admin port: ``SimAdmin(ip, admin_port)``.
"""

from harness.sim._admin import ADMIN_PORT_OFFSET
from harness.sim._admin_client import SimAdmin, SimAdminError
from harness.sim._cli import sim_args
from harness.sim._config import SimConfig, h100_llama_8b, kv_blocks_from_memory
from harness.sim._engine import Engine, EngineState, Run
from harness.sim._kv import text_block_hashes
from harness.sim._received import ReceivedRequest
from harness.sim._server import SERVED_BY_HEADER, ModelServerSim
from harness.sim._thread import SimThread

__all__ = [
    "ADMIN_PORT_OFFSET",
    "SERVED_BY_HEADER",
    "Engine",
    "EngineState",
    "ModelServerSim",
    "ReceivedRequest",
    "Run",
    "SimAdmin",
    "SimAdminError",
    "SimConfig",
    "SimThread",
    "h100_llama_8b",
    "kv_blocks_from_memory",
    "sim_args",
    "text_block_hashes",
]
