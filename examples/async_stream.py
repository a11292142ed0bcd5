"""Stream several requests concurrently through the AsyncEngine, and abort one.

Run: .venv/bin/python examples/async_stream.py
"""
import asyncio

from paged_core import AsyncEngine, EngineConfig, SamplingParams


async def stream(engine: AsyncEngine, request_id: str, prompt: str) -> None:
    params = SamplingParams(max_tokens=48, temperature=0.7, seed=1)
    async for out in engine.generate(prompt, params, request_id=request_id):
        print(f"[{request_id}] {out.outputs[0].delta_text!r}")
    print(f"[{request_id}] finished: {out.outputs[0].finish_reason}")


async def main() -> None:
    engine = AsyncEngine(EngineConfig())
    try:
        tasks = [asyncio.create_task(stream(engine, f"r{i}", f"Fact number {i} about the sea:"))
                 for i in range(3)]
        await asyncio.sleep(0.5)
        await engine.abort("r2")  # its stream ends with finish_reason="abort"; blocks are freed
        await asyncio.gather(*tasks)
        print(engine.stats())
    finally:
        await engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
