"""``PAGED_CORE_CPU_KV_PREFETCH``: how the decode attention starts K and V into L2, picked by
CPU vendor unless set, refused with the setting's name when unknown, and fixed per backend.
(That both policies give the same bits: ``test_cpu_attention_kernel``.)"""
import pytest

from paged_core.attention.torch_backend import TorchAttentionBackend
from paged_core.cpu import kv_prefetch


@pytest.mark.parametrize("vendor,policy", [("GenuineIntel", "first_line"),
                                           ("AuthenticAMD", "every_line"), ("", "every_line")])
def test_auto_picks_by_cpu_vendor(monkeypatch, vendor, policy):
    monkeypatch.setattr(kv_prefetch, "cpu_vendor", lambda: vendor)
    for value in (None, "auto", " AUTO "):
        if value is None:
            monkeypatch.delenv(kv_prefetch.SETTING, raising=False)
        else:
            monkeypatch.setenv(kv_prefetch.SETTING, value)
        assert kv_prefetch.selected_kv_prefetch() == policy
        assert kv_prefetch.kv_first_line() == (policy == "first_line")


def test_a_set_policy_wins_and_an_unknown_one_is_refused(monkeypatch):
    monkeypatch.setattr(kv_prefetch, "cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.setenv(kv_prefetch.SETTING, "every_line")
    assert kv_prefetch.selected_kv_prefetch() == "every_line" and not kv_prefetch.kv_first_line()
    assert kv_prefetch.kv_first_line("first_line")
    monkeypatch.setenv(kv_prefetch.SETTING, "half")
    with pytest.raises(ValueError, match="PAGED_CORE_CPU_KV_PREFETCH='half' is not a KV prefetch "
                                         "policy; choose auto or one of every_line, first_line"):
        kv_prefetch.selected_kv_prefetch()
    with pytest.raises(ValueError, match="PAGED_CORE_CPU_KV_PREFETCH='half'"):
        TorchAttentionBackend()  # an engine's attention refuses it at start-up


def test_the_backend_keeps_the_policy_it_was_built_with(monkeypatch):
    monkeypatch.setenv(kv_prefetch.SETTING, "first_line")
    backend = TorchAttentionBackend()
    monkeypatch.setenv(kv_prefetch.SETTING, "every_line")
    assert backend.kv_prefetch == "first_line"
    assert TorchAttentionBackend().kv_prefetch == "every_line"
