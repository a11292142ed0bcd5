"""The parity tests' engines load their weights as users' do: moved onto huge pages
(``PAGED_CORE_WEIGHTS_ON_HUGE_PAGES``, on by default), which the rest of the suite turns off
for speed (``tests/conftest.py``). A bug in that move once served garbage tokens that only
the oracle could see (batch-invariant float32, 0d35ab3); here the oracle runs where users do.
The one exception: the shared ``llm_fp32`` engine (``tests/conftest.py``) is built by whichever
test asks for it first, maybe outside this folder, so its weights may stay where they loaded."""
import pytest


@pytest.fixture(autouse=True)
def weights_on_huge_pages(monkeypatch):
    monkeypatch.setenv("PAGED_CORE_WEIGHTS_ON_HUGE_PAGES", "true")
