"""``paged-core bench <name> --out DIR`` writes only inside ``DIR``: the result files in
``DIR/results`` and the regenerated ``DIR/README.md`` linking to them (``bench all``
is checked the same way by ``test_bench_quick``), and names the machine it ran on down to
the CPU's generation where ``/proc/cpuinfo`` gives one."""
import json
import re
from pathlib import Path

import pytest

from paged_core.bench.cli import main


def _cpuinfo_generation() -> str | None:
    """``family F, model M`` of the first processor in /proc/cpuinfo, read independently."""
    path = Path("/proc/cpuinfo")
    text = path.read_text().split("\n\n")[0] if path.exists() else ""
    family = re.search(r"^cpu family\s*:\s*(\S+)", text, re.M)
    model = re.search(r"^model\s*:\s*(\S+)", text, re.M)
    return f"family {family.group(1)}, model {model.group(1)}" if family and model else None


@pytest.mark.extended
def test_bench_steps_writes_only_inside_its_out_folder(tmp_path):
    out = tmp_path / "run"
    assert main(["steps", "--quick", "--out", str(out)]) == 0
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")}
    assert written == {"run", "run/README.md", "run/results", "run/results/steps.json",
                       "run/results/steps.png"}
    readme = (out / "README.md").read_text()
    assert "## steps" in readme and "![steps](results/steps.png)" in readme
    machine = json.loads((out / "results" / "steps.json").read_text())["machine"]
    generation = _cpuinfo_generation()
    assert machine["cpu_generation"] == generation
    if generation is not None:  # "AMD EPYC" alone does not tell Zen 4 from Zen 5
        assert f"Machine: {machine['cpu']} [{generation}]" in readme
