"""What every benchmark result carries: the machine, the date, the command, the numbers.

``setup_threads`` fixes the intra-op thread count for every system under test;
``write_result`` saves ``<results>/<name>.json`` (and ``save_plot`` the PNG next to it),
where ``<results>`` is ``results_dir(out)``, inside the ``--out`` folder.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

from ..cpu.cpuinfo import first_cpu_fields

DEFAULT_OUT = Path("benchmarks")  # --out: README.md here, the result files in results/


def results_dir(out_dir: str | Path) -> Path:
    """``<out_dir>/results``: where a run with ``--out out_dir`` writes its JSON and PNG files."""
    return Path(out_dir) / "results"


def setup_threads(threads: int | None) -> int:
    """Use ``threads`` intra-op threads (default: every core); returns the count."""
    import torch

    threads = threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    return threads


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else the platform module's)."""
    return first_cpu_fields().get("model name") or platform.processor() or platform.machine()


def cpu_generation() -> str | None:
    """``family F, model M`` from ``/proc/cpuinfo`` (x86), or None where it has no such fields.

    Virtual machines often name the CPU only by its brand ("AMD EPYC", "Intel(R) Xeon(R)
    Processor"): family and model then tell the generations apart (AMD family 25 is Zen 3 and
    Zen 4, 26 Zen 5; Intel family 6 model 143 Sapphire Rapids, 207 Emerald Rapids)."""
    fields = first_cpu_fields()
    if "cpu family" not in fields or "model" not in fields:
        return None
    return f"family {fields['cpu family']}, model {fields['model']}"


def cpu_flags() -> list[str]:
    """This CPU's vector-ISA flags as torch reports them (avx2, avx512_bf16, amx_bf16, ...)."""
    import torch

    caps = torch.cpu.get_capabilities()
    return sorted(name for name, value in caps.items()
                  if value is True and name.startswith(("avx", "amx", "fma", "f16c")))


def machine_info(threads: int) -> dict[str, Any]:
    import torch
    import transformers

    from ..cpu.isa import selected_cpu_isa

    info = {
        "cpu": cpu_model(),
        "cpu_generation": cpu_generation(),
        # the widest vector ISA torch uses here (e.g. AVX2, AVX512): CPU engines differ most by it
        "cpu_isa": torch.backends.cpu.get_cpu_capability(),
        # paged-core's own CPU path (PAGED_CORE_CPU_ISA or detected) and the flags it rests on
        "paged_core_cpu_isa": selected_cpu_isa(),
        "cpu_flags": cpu_flags(),
        "cores": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def command_line(argv: Sequence[str]) -> str:
    return "paged-core bench " + " ".join(shlex.quote(a) for a in argv)


def write_result(out_dir: str | Path, name: str, argv: Sequence[str], threads: int,
                 results: dict[str, Any]) -> Path:
    """Write ``<out_dir>/<name>.json`` with machine, date, command and ``results``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(argv),
        "machine": machine_info(threads),
        **results,
    }
    path = out / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    return path


def save_plot(fig, out_dir: str | Path, name: str) -> Path:
    """Save a matplotlib figure as ``<out_dir>/<name>.png`` and close it."""
    import matplotlib.pyplot as plt

    path = Path(out_dir) / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def new_figure(ncols: int = 1, width: float = 6.0, height: float = 4.0):
    """A (figure, axes) pair drawn with the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)


def percentiles(values: Sequence[float], points: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    """``{"mean": ..., "p50": ..., ...}`` of ``values`` (linear interpolation); empty -> {}."""
    import numpy as np

    if not values:
        return {}
    data = np.asarray(values, dtype=float)
    out = {"mean": float(data.mean())}
    out.update({f"p{p}": float(np.percentile(data, p)) for p in points})
    return out
