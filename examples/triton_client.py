"""Stream tokens from the Triton-hosted engine over gRPC and HTTP.

Start the server first (HTTP 8000, gRPC 8001, metrics 8002)::

    PAGED_CORE_DTYPE=float32 python -m paged_core.adapters.triton_server --host 127.0.0.1 --port 8000

then::

    python examples/triton_client.py --http 127.0.0.1:8000 --grpc 127.0.0.1:8001
"""
from __future__ import annotations

import argparse
import json
import queue

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

MODEL = "paged_llm"


def grpc_inputs(prompt: str, params: dict) -> list[grpcclient.InferInput]:
    tensors = []
    for name, dtype, value in (
            ("text_input", "BYTES", np.array([prompt.encode()], dtype=np.object_)),
            ("stream", "BOOL", np.array([True])),
            ("sampling_parameters", "BYTES", np.array([json.dumps(params).encode()],
                                                      dtype=np.object_))):
        tensor = grpcclient.InferInput(name, [1], dtype)
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return tensors


def stream_grpc(url: str, prompt: str, params: dict) -> str:
    """Send one request on a gRPC stream; print each delta as it arrives."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(MODEL, grpc_inputs(prompt, params), request_id="example")
        text = ""
        while True:
            result, error = responses.get(timeout=300)
            if error is not None:
                raise RuntimeError(error)
            delta = result.as_numpy("text_output")[0].decode()
            print(delta, end="", flush=True)
            text += delta
            if result.get_response().parameters["triton_final_response"].bool_param:
                print()
                return text
    finally:
        client.stop_stream()  # close the stream before the server is stopped
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", default="127.0.0.1:8000")
    parser.add_argument("--grpc", default="127.0.0.1:8001")
    args = parser.parse_args()
    params = {"max_tokens": 32, "temperature": 0}

    print("gRPC stream: ", end="")
    stream_grpc(args.grpc, "The capital of France is", params)

    body = {"text_input": "The capital of France is", "stream": True,
            "sampling_parameters": json.dumps(params)}
    print("HTTP generate_stream: ", end="")
    with httpx.stream("POST", f"http://{args.http}/v2/models/{MODEL}/generate_stream",
                      json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                print(json.loads(line[6:])["text_output"], end="", flush=True)
    print()


if __name__ == "__main__":
    main()
