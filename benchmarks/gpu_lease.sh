#!/bin/bash
# benchmarks/gpu_suite.py on a lent GPU machine that has torch, triton and an older
# transformers but no internet, in two steps:
#   here:   bash benchmarks/gpu_lease.sh prepare
#           -> .whl/: wheels for that machine's Python 3.12 of what it lacks or has too old
#              (the versions this checkout's .venv runs: the oracle is the same transformers);
#              .gpu_carry/tokenizer: the embedded model's tokenizer (PAGED_CORE_TEST_TOKENIZER)
#   there:  bash benchmarks/gpu_lease.sh run [gpu_suite.py arguments]   (carry .whl, .gpu_carry)
#           installs the wheels under /tmp/site, links kernels/ as paged_core.kernels, writes
#           $OUT/a (gpu_suite.json, suite.log, tests.log); SUITE_S bounds the suite's seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
# what the machine's image lacks (pydantic, gguf, xgrammar) or has too old for transformers
# (its needs: huggingface-hub >= 2.4 with httpx2, kernels 0.19)
WHEELS="transformers gguf xgrammar apache-tvm-ffi pydantic pydantic-core annotated-types
typing-inspection typing-extensions kernels tomlkit huggingface-hub hf-xet httpx2 httpcore2
truststore click"

prepare() {
    local platforms="" version name
    for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014; do
        platforms+=" --platform ${tag}_x86_64"
    done
    mkdir -p .whl .gpu_carry/tokenizer
    for name in $WHEELS; do
        version=$(.venv/bin/python -m pip show "$name" | awk '/^Version:/ {print $2}')
        [ -n "$version" ] || { echo "$name is not installed in .venv" >&2; return 1; }
        .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp $platforms -d .whl "$name==$version" || return 1
    done
    local folder
    folder=$(.venv/bin/python -c "from paged_core.models.embedded_model import \
embedded_model_folder as f; print(f())") || return 1
    cp "$folder"/{tokenizer.json,tokenizer_config.json,chat_template.jinja,config.json} \
        .gpu_carry/tokenizer/
    du -sh .whl .gpu_carry
}

run() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || return 3
    export PYTHONPATH=/tmp/site:$PWD PAGED_CORE_TEST_TOKENIZER=$PWD/.gpu_carry/tokenizer \
        PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TRITON_INTERPRET=0
    ln -sfn ../kernels paged_core/kernels
    mkdir -p "$OUT/a"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    python3 -c "import torch, triton, transformers, xgrammar, paged_core.kernels
print(torch.__version__, triton.__version__, transformers.__version__)" || return 4
    timeout "${SUITE_S:-500}" python3 benchmarks/gpu_suite.py --out "$OUT/a" "$@" 2>&1 \
        | tee "$OUT/a/suite.log" | grep -v '^\s*$' | tail -c 9000
}

case "${1:-}" in
    prepare) prepare ;;
    run) shift; run "$@" ;;
    *) echo "usage: bash benchmarks/gpu_lease.sh prepare | run [gpu_suite.py arguments]" >&2
       exit 2 ;;
esac
