"""Every CPU level this machine can run builds its C++ kernels.

The ``cpu_isa`` fixtures skip a level whose kernels do not build (a machine without a
compiler for it); on a CPU that runs the level, a build error is a bug, and without this
test it would only turn that level's tests into skips."""
import pytest

from paged_core.cpu.extension import cpu_extension_available, cpu_extension_error
from paged_core.cpu.isa import CPU_ISA_LEVELS, unsupported_reason


@pytest.mark.parametrize("level", CPU_ISA_LEVELS)
def test_every_level_this_cpu_runs_builds(level):
    reason = unsupported_reason(level)
    if reason is not None:
        pytest.skip(reason)
    assert cpu_extension_available(level), cpu_extension_error(level)
