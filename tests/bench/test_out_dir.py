"""``paged-core bench <name> --out DIR`` writes only inside ``DIR``: the result files in
``DIR/results`` and the regenerated ``DIR/README.md`` linking to them (``bench all``
is checked the same way by ``test_bench_quick``)."""
from paged_core.bench.cli import main


def test_bench_steps_writes_only_inside_its_out_folder(tmp_path):
    out = tmp_path / "run"
    assert main(["steps", "--quick", "--out", str(out)]) == 0
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")}
    assert written == {"run", "run/README.md", "run/results", "run/results/steps.json",
                       "run/results/steps.png"}
    readme = (out / "README.md").read_text()
    assert "## steps" in readme and "![steps](results/steps.png)" in readme
