"""``python -m harness.sim --host 127.0.0.5 --port 8000 --model base --lora a,b``"""

from __future__ import annotations

import argparse
import asyncio
import signal

from harness.sim._config import (
    DEFAULT_MAX_LORAS,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_MODEL,
    DEFAULT_NUM_GPU_BLOCKS,
    DEFAULT_PORT,
    DEFAULT_VLLM_VERSION,
    SimConfig,
)
from harness.sim._server import ModelServerSim


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.sim", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="loopback address to bind (127.0.0.0/8)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--model", default=DEFAULT_MODEL, help="base model name")
    p.add_argument("--lora", default="", help="comma-separated LoRA adapter names")
    p.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS)
    p.add_argument("--max-loras", type=int, default=DEFAULT_MAX_LORAS)
    p.add_argument("--num-gpu-blocks", type=int, default=DEFAULT_NUM_GPU_BLOCKS)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--time-scale", type=float, default=1.0, help="multiplies every simulated delay")
    p.add_argument(
        "--vllm-version",
        default=DEFAULT_VLLM_VERSION,
        help="vLLM release whose metric names to publish (before 0.10: vllm:gpu_cache_usage_perc)",
    )
    return p


async def _serve(sim: ModelServerSim) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with sim:
        print(f"simulator {sim.config.model!r} serving on {sim.base_url}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if not args.host.startswith("127."):
        raise SystemExit("--host must be a loopback address (127.0.0.0/8)")
    config = SimConfig(
        model=args.model,
        lora_adapters=tuple(name for name in args.lora.split(",") if name),
        max_num_seqs=args.max_num_seqs,
        max_loras=args.max_loras,
        num_gpu_blocks=args.num_gpu_blocks,
        max_model_len=args.max_model_len,
        time_scale=args.time_scale,
        vllm_version=args.vllm_version,
    )
    asyncio.run(_serve(ModelServerSim(args.host, args.port, config)))


if __name__ == "__main__":
    main()
