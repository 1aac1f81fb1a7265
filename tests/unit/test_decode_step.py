"""policy/decode_step.py: the sampler's own decode step gives the tokens and log-probs Hugging Face's forward gives in
the same loop (bit for bit in fp32 and in bf16), with padding and without, for both embedded architectures; it is
rebuilt when the weights change and stands aside for models it cannot run. Its compiled kernels give the eager
step's greedy tokens and log-probs within float32 rounding, or fall back to the eager ones, saying why; finished rows
leave the cache in place."""

from __future__ import annotations

import copy
import dataclasses
import gc
import logging
import os
import subprocess
import sys
import weakref

import pytest
import torch

from pubswap_flwr.policy import decode_step
from pubswap_flwr.policy.decode_step import (
    EAGER,
    DecodeStep,
    compile_unavailable_reason,
    unsupported_reason,
)
from pubswap_flwr.policy.sampling import GenerationSettings, generate, keep_rows
from pubswap_flwr.tasks import HeldOutSet, parse_mix
from tests.conftest import perturbed_tiny_policies
from tests.scripts import ROOT

MIX = "basic_arithmetic:1,gcd:1,count_bits:1,spell_backward:1"


@pytest.fixture(scope="module")
def policies():
    return perturbed_tiny_policies()


def _prompts(policy, count: int = 6) -> list[str]:
    items = HeldOutSet.build(parse_mix(MIX), per_task=count).items
    return policy.prompts(items[::max(1, len(items) // count)][:count])


def _both(model, tokenizer, prompts, settings, **kwargs):
    """The same call with the decode step and with Hugging Face's forward in every step."""
    runs = []
    for use_step in (True, False):
        torch.manual_seed(7)
        runs.append(generate(model, tokenizer, prompts, settings=dataclasses.replace(settings, decode_step=use_step),
                             **kwargs))
    return runs


def _assert_same(ours, theirs):
    assert [[s.token_ids for s in row] for row in ours] == [[s.token_ids for s in row] for row in theirs]
    assert [[s.logprobs for s in row] for row in ours] == [[s.logprobs for s in row] for row in theirs]
    assert [[s.finished for s in row] for row in ours] == [[s.finished for s in row] for row in theirs]


@pytest.mark.parametrize("name", ["embedded:tiny", "embedded:tiny-b"])
@pytest.mark.parametrize("greedy", [True, False])
def test_same_tokens_and_logprobs_as_hugging_face_forward(policies, name, greedy):
    policy = policies[name]
    prompts = _prompts(policy)  # different lengths: left padding, the masked attention path
    settings = GenerationSettings(max_new_tokens=24, temperature=0.8, top_k=50, top_p=0.95)
    with policy.sampler.merged():
        ours, theirs = _both(policy.sampling_model, policy.tokenizer, prompts, settings, num_return=4,
                             greedy=greedy, greedy_first=0 if greedy else 1)
        assert DecodeStep.for_model(policy.sampling_model) is not None  # it ran the steps
    _assert_same(ours, theirs)
    assert sum(len(s.token_ids) for row in ours for s in row) > 4 * len(prompts)  # it decoded past the prefill
    assert any(s.finished for row in ours for s in row)  # rows left the batch: the compaction path ran


def test_same_without_padding_and_with_per_prompt_streams(policies):
    policy = policies["embedded:tiny"]
    prompt = _prompts(policy, 1)[0]
    settings = GenerationSettings(max_new_tokens=16)
    with policy.sampler.merged():  # one prompt: no row is padded, attention without a mask (grouped heads)
        ours, theirs = _both(policy.sampling_model, policy.tokenizer, [prompt, prompt], settings, num_return=3,
                             prompt_seeds=[1, 2])
    _assert_same(ours, theirs)
    assert [s.token_ids for s in ours[0]] != [s.token_ids for s in ours[1]]  # each prompt its own streams


def test_bf16_copy_gives_the_same_as_hugging_face_forward(policies):
    policy = policies["embedded:tiny-b"]
    with policy.sampler.merged():
        low = copy.deepcopy(policy.sampling_model).to(torch.bfloat16)
    assert isinstance(low, torch.nn.Module)
    ours, theirs = _both(low, policy.tokenizer, _prompts(policy), GenerationSettings(max_new_tokens=16), num_return=2)
    _assert_same(ours, theirs)
    assert next(iter(ours[0][0].logprobs), None) is not None


def test_rebuilt_after_the_weights_change(policies):
    policy = policies["embedded:tiny"]
    model = copy.deepcopy(policy.model).merge_and_unload()
    prompts = _prompts(policy, 3)
    settings = GenerationSettings(max_new_tokens=12)
    first = DecodeStep.for_model(model)
    assert DecodeStep.for_model(model) is first  # nothing written: the same step
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    second = DecodeStep.for_model(model)
    assert second is not first
    ours, theirs = _both(model, policy.tokenizer, prompts, settings, num_return=1, greedy=True)
    _assert_same(ours, theirs)


def test_unmerged_adapter_falls_back_to_hugging_face_forward(policies):
    policy = policies["embedded:tiny"]  # the PEFT model outside `merged()`: its adapters add their own path
    assert unsupported_reason(policy.model) == "a linear layer with an unmerged adapter"
    assert DecodeStep.for_model(policy.model) is None
    with pytest.raises(ValueError, match="DecodeStep cannot run this model: a linear layer with an unmerged adapter"):
        DecodeStep(policy.model)
    ours, theirs = _both(policy.model, policy.tokenizer, _prompts(policy, 3), GenerationSettings(max_new_tokens=8),
                         num_return=1, greedy=True)
    _assert_same(ours, theirs)
    with policy.sampler.merged():  # merged, the LoRA layers compute their base layers: supported
        assert unsupported_reason(policy.model) is None


def test_unsupported_configurations_are_named(policies):
    model = copy.deepcopy(policies["embedded:tiny"].model).merge_and_unload()
    model.config._attn_implementation = "eager"
    assert unsupported_reason(model) == "attention implementation 'eager' (sdpa only)"
    model.config._attn_implementation = "sdpa"
    model.config.hidden_act = "gelu"
    assert unsupported_reason(model) == "activation 'gelu' (silu only)"
    model.config.hidden_act = "silu"
    model.config.model_type = "gpt2"
    assert "model type 'gpt2' is not one of" in unsupported_reason(model)


def test_merged_sampling_leaves_no_step_holding_copies_of_its_merged_weights(policies):
    """After `merged()` the frozen weights are back, so the step built on the merged ones is stale; it is dropped with
    its fused copies of them (q, k, v and gate, up: about 270 MiB for SmolLM2-135M in float32)."""
    policy = policies["embedded:tiny"]
    with policy.sampler.merged():
        generate(policy.sampling_model, policy.tokenizer, _prompts(policy, 2), num_return=1, greedy=True,
                 settings=GenerationSettings(max_new_tokens=4, decode_step=True))
        step = DecodeStep.for_model(policy.sampling_model)
        assert step is not None and step.fuse
        fused = [weakref.ref(layer.qkv[0][0]) for layer in step.layers] + \
            [weakref.ref(layer.gate_up[0]) for layer in step.layers]
        del step
    gc.collect()
    assert [ref() for ref in fused] == [None] * len(fused)


@pytest.mark.parametrize("kept", [[0, 1, 2, 3, 4], [0, 2, 3], [1, 4], [3], [0, 1, 4]])
def test_finished_rows_leave_the_cache_in_place(kept):
    buffer = torch.randn(5, 2, 9, 3)
    expected = buffer[torch.tensor(kept), :, :6].clone()
    kept_rows = keep_rows(buffer, torch.tensor(kept), 6)
    assert kept_rows.data_ptr() == buffer.data_ptr() and kept_rows.shape == (len(kept), 2, 9, 3)  # no new buffer
    assert torch.equal(kept_rows[:, :, :6], expected)


def test_rows_in_another_order_are_gathered():
    buffer = torch.randn(4, 2, 5, 3)
    indices = torch.tensor([2, 0, 0])
    assert torch.equal(keep_rows(buffer, indices, 5), buffer[indices])


@pytest.fixture
def no_cpp_compiler(monkeypatch):
    from torch._inductor import config
    from torch._inductor.cpp_builder import cpp_compiler_search

    monkeypatch.setattr(config.cpp, "cxx", ("no-such-compiler-for-this-test",))
    cpp_compiler_search.cache_clear()
    decode_step.warmed_kernels.cache_clear()
    yield
    cpp_compiler_search.cache_clear()
    decode_step.warmed_kernels.cache_clear()


def test_without_a_compiler_the_compiled_step_runs_its_eager_kernels_and_says_why(policies, no_cpp_compiler, caplog):
    reason = compile_unavailable_reason(torch.device("cpu"))
    assert reason is not None and "no C++ compiler" in reason and "no-such-compiler-for-this-test" in reason
    assert compile_unavailable_reason(torch.device("meta")) is None  # only CPU kernels need one
    policy = policies["embedded:tiny"]
    model = copy.deepcopy(policy.model).merge_and_unload()
    eager = DecodeStep.for_model(model)
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr"):
        step = DecodeStep.for_model(model, compiled=True)
    assert step is not eager and step is not None and step.compiled and step.kernels is EAGER  # rebuilt, eager
    assert f"generation.compile-step: {reason}; the decode step runs its eager kernels" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pubswap_flwr"), torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1.0)  # a write: the step is rebuilt, as every round
        assert DecodeStep.for_model(model, compiled=True) is not step
    assert "generation.compile-step" not in caplog.text  # said once for these shapes
    settings = GenerationSettings(max_new_tokens=12)
    compiled = generate(model, policy.tokenizer, _prompts(policy, 3), num_return=1, greedy=True,
                        settings=dataclasses.replace(settings, compile_step=True))
    plain = generate(model, policy.tokenizer, _prompts(policy, 3), num_return=1, greedy=True, settings=settings)
    _assert_same(compiled, plain)


_FAILING_COMPILE = """
import logging, sys
import torch
from torch._inductor import config
from transformers import LlamaConfig, LlamaForCausalLM
from pubswap_flwr.policy.decode_step import EAGER, DecodeStep
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
config.cpp.cxx = (sys.argv[1],)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa"))
print("eager" if DecodeStep(model, compiled=True).kernels is EAGER else "compiled")
"""


@pytest.mark.slow
def test_a_compiler_that_fails_leaves_the_eager_kernels_and_says_so(tmp_path):
    failing = tmp_path / "g++"  # answers --version as a compiler does, then fails every compile
    failing.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo "g++ (a test) 12"; exit 0; fi\nexit 1\n')
    failing.chmod(0o755)
    # its own process: a failed compile leaves inductor's process-wide state (its cache folder, its compiler) behind
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-c", _FAILING_COMPILE, str(failing)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "eager"
    assert any(line.startswith("generation.compile-step: torch.compile failed (") and
               line.endswith("); the decode step runs its eager kernels") for line in lines), done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", ["embedded:tiny", "embedded:tiny-b"])
def test_compiled_kernels_give_the_eager_steps_tokens_and_logprobs_within_rounding(policies, name):
    if (reason := compile_unavailable_reason(torch.device("cpu"))) is not None:
        pytest.skip(reason)  # a machine without a C++ compiler (the fallback has its own tests)
    policy = policies[name]
    prompts = _prompts(policy)  # padded rows; some finish early: the batch shrinks to other sizes (dynamic shapes)
    settings = GenerationSettings(max_new_tokens=24)
    with policy.sampler.merged():
        runs = []
        for compile_step in (True, False):
            runs.append(generate(policy.sampling_model, policy.tokenizer, prompts, num_return=2, greedy=True,
                                 settings=dataclasses.replace(settings, compile_step=compile_step)))
            step = DecodeStep.for_model(policy.sampling_model, compile_step)  # the step that call ran
            assert step is not None and step.kernels is (decode_step.compiled_kernels() if compile_step else EAGER)
    compiled, eager = runs
    assert [[s.token_ids for s in row] for row in compiled] == [[s.token_ids for s in row] for row in eager]
    gaps = [abs(a - b) for row_c, row_e in zip(compiled, eager) for c, e in zip(row_c, row_e)
            for a, b in zip(c.logprobs, e.logprobs)]
    assert len(gaps) > 4 * len(prompts) and max(gaps) < 1e-4  # RMSNorm's reduction rounds differently, no more
    assert any(s.finished for row in eager for s in row)
