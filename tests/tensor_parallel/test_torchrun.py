"""Multi-node tensor parallelism: two ``torchrun`` launches (``--nnodes 2``, one process
each, as two machines would run them) on 127.0.0.1 form one engine."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from paged_core import LLM, SamplingParams

from ..tiny_models import build_tiny_model
from ..reference import passage_token_ids

pytestmark = pytest.mark.extended

TORCHRUN = Path(sys.executable).with_name("torchrun")


def torchrun_node(node_rank: int, port: int, folder: str, prompt: str) -> subprocess.Popen:
    cmd = [str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node_rank),
           "--master-addr", "127.0.0.1", "--master-port", str(port),
           "-m", "paged_core.worker", "generate", prompt, "--json", "--max-tokens", "16",
           "--model", folder, "--dtype", "float32", "--num-kv-blocks", "32",
           "--tensor-parallel-size", "2"]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)


def test_two_torchrun_nodes_form_one_engine(tokenizer, tmp_path):
    from paged_core.executor.group import free_port

    folder = build_tiny_model("qwen3", str(tmp_path / "qwen3"), tokenizer)
    prompt = tokenizer.decode(passage_token_ids(tokenizer, 30))
    port = free_port()
    nodes = [torchrun_node(rank, port, folder, prompt) for rank in (0, 1)]
    try:
        results = [node.communicate(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    for node, (_, err) in zip(nodes, results):
        assert node.returncode == 0, err[-3000:]
    driver_lines = [json.loads(line) for line in results[0][0].splitlines() if line.startswith("{")]
    assert len(driver_lines) == 1 and results[1][0].strip() == ""  # only rank 0 prints

    with LLM(model=folder, dtype="float32", num_kv_blocks=32) as single:
        expected = single.generate([prompt], SamplingParams(temperature=0, max_tokens=16),
                                   use_tqdm=False)[0].outputs[0].token_ids
    assert driver_lines[0]["token_ids"] == expected
