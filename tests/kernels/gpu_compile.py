"""Compile every kernel launch the launchers make into NVIDIA cubins, without a GPU.

Run as ``TRITON_INTERPRET=0 python tests/kernels/gpu_compile.py`` (it is what
``test_gpu_compile.py`` runs). The real launchers are called on CPU tensors with
each kernel's launch replaced by a compile: Triton's own JIT binder turns the
launch arguments into the signature, constexprs and divisibility hints it would
use on a GPU, and ``triton.compile`` lowers them with the bundled ``ptxas`` for
sm_80 and sm_90. This catches what the CPU interpreter cannot: invalid ``tl.dot``
shapes, type errors in the compiled dialect, shared-memory overflow. It prints
one JSON line per distinct kernel and arch (with register use when
``cuobjdump`` is available) and exits non-zero on the first failure.

It uses Triton internals (``create_function_from_signature``,
``JITFunction._pack_args``); exit status 3 means those are missing.
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
import triton

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
except ImportError as exc:  # pragma: no cover - depends on the Triton version
    print(f"unsupported Triton internals: {exc}", file=sys.stderr)
    sys.exit(3)

from paged_core.kernels import attention, attention_kernels, cache_ops, elementwise  # noqa: E402
from paged_core.kernels import copy_blocks, paged_attention, write_kv_cache  # noqa: E402

ARCHS = (80, 90)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                         "cuobjdump")
_seen: set[str] = set()


def _resources(cubin: bytes) -> str | None:
    if not os.path.exists(CUOBJDUMP):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name],
                             capture_output=True, text=True).stdout
    lines = [line.strip() for line in out.splitlines() if "REG:" in line]
    return lines[0].split(" SHARED")[0] if lines else None


def _compile_instead_of_launch(fn, *args, grid, warmup, **kwargs):
    for arch in ARCHS:
        target = GPUTarget("cuda", arch, 32)
        backend = make_backend(target)
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(
            backend, kwargs, bound, specialization, options)
        key = repr((fn.__name__, arch, signature, sorted(constexprs.items()),
                    sorted(attrs.items())))
        if key in _seen:
            continue
        _seen.add(key)
        kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                options=options.__dict__)
        named = {fn.arg_names[path[0]]: value for path, value in constexprs.items()}
        print(json.dumps(dict(kernel=fn.__name__, arch=f"sm_{arch}", shared=kernel.metadata.shared,
                              resources=_resources(kernel.asm["cubin"]),
                              constexprs={k: str(v) for k, v in named.items()})), flush=True)


def _attention_case(dtype, heads, kv_heads, dim, block_size, kind, window=None, splits=None,
                    kv_dtype=None):
    """``kv_dtype``: a quantized cache (rows of ``dim + 4``: ``attention.kv_quant``)."""
    q_lens = {"decode": [1, 1, 1], "prefill": [70, 33, 5]}[kind]
    seq_lens = [300, 90, 40]
    blocks = -(-max(seq_lens) // block_size)
    q = torch.zeros(sum(q_lens), heads, dim, dtype=dtype)
    cache = torch.zeros(blocks * 3, block_size, kv_heads, dim + (4 if kv_dtype else 0),
                        dtype=kv_dtype or dtype)
    tables = torch.zeros(3, blocks, dtype=torch.int32)
    starts = torch.tensor([0, *q_lens], dtype=torch.int32).cumsum(0).to(torch.int32)
    paged_attention(q, cache, cache, tables, torch.tensor(seq_lens, dtype=torch.int32), starts,
                    dim ** -0.5, window, num_splits=splits)


def main() -> None:
    if triton.knobs.runtime.interpret:
        sys.exit("run with TRITON_INTERPRET=0: interpreted kernels cannot be compiled")
    for fn in (attention_kernels.paged_attention_kernel, attention_kernels.merge_splits_kernel,
               cache_ops._write_kv_kernel, cache_ops._copy_blocks_kernel,
               elementwise._rms_norm_kernel, elementwise._rotary_kernel,
               elementwise._silu_and_mul_kernel):
        fn.run = lambda *a, _fn=fn, **kw: _compile_instead_of_launch(_fn, *a, **kw)
    attention.check_device = cache_ops.check_device = lambda *tensors: None  # CPU tensors
    f16, b16, f32 = torch.float16, torch.bfloat16, torch.float32
    _attention_case(f16, 32, 8, 128, 16, "decode")
    _attention_case(f16, 32, 8, 128, 16, "decode", splits=4)
    _attention_case(b16, 32, 8, 128, 16, "prefill", window=4096)
    _attention_case(b16, 14, 2, 64, 32, "prefill")  # group of 7, padded to 8
    _attention_case(f16, 16, 1, 256, 64, "prefill")  # MQA, head_dim 256
    _attention_case(f16, 16, 1, 256, 64, "decode", splits=2)
    _attention_case(f16, 32, 32, 80, 128, "prefill")  # head_dim 80, block 128
    _attention_case(f32, 4, 4, 64, 8, "prefill")
    _attention_case(f32, 4, 4, 64, 8, "decode", splits=2)
    _attention_case(b16, 32, 8, 128, 16, "decode", kv_dtype=torch.int8)  # quantized caches
    _attention_case(f16, 14, 2, 64, 32, "prefill", kv_dtype=torch.float8_e4m3fn)
    _attention_case(f32, 4, 4, 64, 8, "decode", splits=2, kv_dtype=torch.float8_e5m2)
    for dtype, kv_heads, dim, block_size in ((f16, 8, 128, 16), (b16, 1, 256, 64),
                                             (f32, 4, 64, 8)):
        cache = torch.zeros(4, block_size, kv_heads, dim, dtype=dtype)
        kv = torch.zeros(3, kv_heads, dim, dtype=dtype)
        write_kv_cache(kv, kv, cache, cache, torch.zeros(3, dtype=torch.long))
        copy_blocks(cache, cache, torch.tensor([0]), torch.tensor([1]))
    cache = torch.zeros(4, 16, 8, 128 + 4, dtype=torch.int8)  # quantized: moved as bytes
    kv = torch.zeros(3, 8, 128, dtype=b16)
    write_kv_cache(kv, kv, cache, cache, torch.zeros(3, dtype=torch.long))
    copy_blocks(cache, cache, torch.tensor([0]), torch.tensor([1]))
    _elementwise_cases()


def _elementwise_cases() -> None:
    """Llama-3-8B's and Phi-4-mini's shapes (partial rotary), in both 16-bit dtypes and float32."""
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for hidden, heads, kv_heads, dim, rotary_dim in ((4096, 32, 8, 128, 128),
                                                          (3072, 24, 8, 128, 96)):
            x = torch.zeros(3, hidden, dtype=dtype)
            elementwise.rms_norm(x, torch.ones(hidden, dtype=dtype), 1e-5, residual=x.clone())
            elementwise.rms_norm(x, torch.ones(hidden, dtype=dtype), 1e-5)
            qkv = torch.zeros(3, (heads + 2 * kv_heads) * dim, dtype=dtype)
            q = qkv[:, :heads * dim].view(3, heads, dim)
            k = qkv[:, heads * dim:(heads + kv_heads) * dim].view(3, kv_heads, dim)
            table = torch.zeros(64, rotary_dim, dtype=dtype)
            elementwise.rotate_(q, k, torch.zeros(3, dtype=torch.long), table, table)
            elementwise.silu_and_mul(torch.zeros(3, 2 * 14336, dtype=dtype))


if __name__ == "__main__":
    main()
