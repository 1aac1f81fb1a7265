"""policy/memory.py: the allocator settings that stop a model process from keeping freed memory, and the seeded
LoRA initialization of a new Policy."""

from __future__ import annotations

import torch

from pubswap_flwr.policy import memory


def test_release_trims_the_heap_and_the_environment_switch_turns_it_off(monkeypatch):
    monkeypatch.delenv("PUBSWAP_ALLOCATOR", raising=False)
    assert memory.enabled()  # this machine's libc is glibc
    assert isinstance(memory.release(), bool)
    monkeypatch.setenv("PUBSWAP_ALLOCATOR", "default")
    assert not memory.enabled() and memory.release() is False


def test_retention_is_limited_once_per_process(monkeypatch):
    calls = []

    class FakeLibc:
        def mallopt(self, parameter, value):
            calls.append((parameter, value))
            return 1

        def malloc_trim(self, pad):
            return 1

    monkeypatch.setattr(memory, "_libc", lambda: FakeLibc())
    monkeypatch.setattr(memory, "_applied", [])
    monkeypatch.delenv("PUBSWAP_ALLOCATOR", raising=False)
    assert memory.limit_retention() and memory.limit_retention()
    assert calls == [(memory.M_MMAP_THRESHOLD, 64 * 1024)]


def test_a_new_policy_starts_from_the_same_adapter_whatever_the_global_generator(tiny_location):
    from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec

    spec = PolicySpec(lora=LoraSettings(r=4, alpha=8))
    torch.manual_seed(1)
    first = Policy(spec).adapter()
    torch.manual_seed(2)
    second = Policy(spec).adapter()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert any(float(v.abs().sum()) > 0 for v in first.values())  # LoRA A is drawn, not zero
