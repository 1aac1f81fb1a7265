"""A packaged variant's adapter merged at a scale (a half-warm model, #52 item 4): the merged update is the scale
times the full one."""

import pytest

torch = pytest.importorskip("torch")


def _lora_model(seed: int):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_()  # a trained adapter: B is not zero
    return model


@pytest.mark.parametrize("scale", [0.0, 0.5, 1.0, 1.5])
def test_a_scaled_merge_moves_the_weights_by_the_scale_times_the_full_update(scale):
    from pubswap_flwr.policy.packaged import scaled

    def merged_and_base(s: float):
        model = _lora_model(0)
        base = {k.replace("base_layer.", ""): v.clone() for k, v in model.get_base_model().state_dict().items()
                if "lora" not in k}
        return scaled(model, s).merge_and_unload().state_dict(), base

    full, base = merged_and_base(1.0)
    part, same_base = merged_and_base(scale)
    assert set(full) == set(base)
    moved = [k for k in base if not torch.equal(full[k], base[k])]
    assert {k.split(".")[-2] for k in moved} == {"q_proj", "v_proj"}  # only the adapted weights moved
    for key, weight in base.items():
        assert torch.equal(weight, same_base[key])  # one seed: the same base and adapter before scaling
        assert torch.allclose(part[key], weight + scale * (full[key] - weight), atol=1e-6), key
