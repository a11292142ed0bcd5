"""``bench serve``'s scenario lists: Poisson rates alone, bursts alone, and neither (a clear
error, not a traceback)."""
import argparse

import pytest

from paged_core.bench import serve


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(list(argv))


def test_poisson_rates_without_a_burst():
    rates, per_rate, bursts, spec = serve.workload(_args("--rates", "1,2", "--burst", "",
                                                         "--repeats", "3"))
    assert rates == [1.0, 2.0] and bursts == [] and per_rate == 24
    assert spec.num_requests == 24 * 3  # a run's rates share its 24 requests


def test_bursts_without_poisson_rates_take_only_their_own_requests():
    rates, _, bursts, spec = serve.workload(_args("--rates", "", "--burst", "10,6"))
    assert rates == [] and bursts == [10, 6] and spec.num_requests == 10


def test_no_scenario_at_all_is_refused_naming_both_options():
    with pytest.raises(SystemExit, match="--rates and --burst"):
        serve.workload(_args("--rates", "", "--burst", ""))
