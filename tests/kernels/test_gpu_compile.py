"""The compiled (GPU) side of the kernels, checked without a GPU.

The interpreter runs the kernels' Python semantics but never lowers them, so a
kernel can pass every other test here and still fail to compile for a GPU.
``gpu_compile.py`` compiles each launch the launchers make (decode, prefill,
split-KV + merge, sliding window, GQA padding, head_dim 80/256, three dtypes,
quantized int8 / fp8 caches, cache ops, the fused elementwise steps) to sm_80 and sm_90 cubins with Triton's bundled ``ptxas``.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

SCRIPT = Path(__file__).with_name("gpu_compile.py")
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton build has no bundled ptxas")
def test_every_launch_compiles_for_sm80_and_sm90():
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          env=env, timeout=600)
    if proc.returncode == 3:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr[-4000:]
    compiled = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    kernels = {(c["kernel"], c["arch"]) for c in compiled}
    assert kernels == {(k, a) for a in ("sm_80", "sm_90") for k in (
        "paged_attention_kernel", "merge_splits_kernel", "_write_kv_kernel",
        "_copy_blocks_kernel", "_rms_norm_kernel", "_rotary_kernel", "_silu_and_mul_kernel")}
    configs = {(c["arch"], json.dumps(c["constexprs"], sort_keys=True)) for c in compiled
               if c["kernel"] == "paged_attention_kernel"}
    assert len(configs) == 2 * 12  # every attention case is a distinct specialisation
