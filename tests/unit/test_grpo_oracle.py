"""Our GRPO/DAPO loss and LoRA gradients equal TRL 1.16 GRPOTrainer._compute_loss on the same batch (TRL is only a
test dependency: the oracle)."""

from __future__ import annotations

import pytest
import torch

from pubswap_flwr.policy.grpo import GRPOSettings, build_batch, group_advantages, micro_batch_loss
from pubswap_flwr.policy.sampling import GenerationSettings
from pubswap_flwr.rollouts import Completion, RolloutGroup

trl = pytest.importorskip("trl")


def _groups(tokenizer):
    prompts = ["<|im_start|>user\nCalculate 4 + 7.\nReply with only the final answer as <answer>X</answer>.<|im_end|>\n"
               "<|im_start|>assistant\n",
               "<|im_start|>user\nSpell this word backward (example: sun -> nus): lamp\nReply with only the final "
               "answer as <answer>X</answer>.<|im_end|>\n<|im_start|>assistant\n"]
    eos = tokenizer.eos_token_id
    own = lambda text: Completion(text, tuple(tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]))
    return [
        RolloutGroup(prompts[0], [own("<answer>11</answer>"), own("<answer>12</answer>"),
                                  Completion("<answer>11</answer> sure", source="peer-1"), own("<answer>1</answer>")],
                     [1.0, 0.0, 1.0, 0.0]),
        RolloutGroup(prompts[1], [own("<answer>pmal</answer>"), Completion("<answer>plma</answer>", source="peer-2"),
                                  own("<answer>pmla</answer>"), own("<answer>lamp</answer>")],
                     [1.0, 0.25, 0.5, 0.0]),
    ]


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_loss_and_lora_gradients_match_trl(tmp_path, tiny_policy, loss_type):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    policy = tiny_policy
    model, tokenizer = policy.model, policy.tokenizer
    # Make the adapter non-trivial so gradients flow into both A and B.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    settings = GRPOSettings(loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28)
    batch = build_batch(tokenizer, _groups(tokenizer), GenerationSettings(max_new_tokens=16))
    advantages = group_advantages(batch.rewards, batch.group_sizes)
    n = batch.rewards.shape[0]
    model.train()
    with torch.no_grad():
        current = micro_batch_loss(model, batch, slice(0, n), advantages, None, None, settings, 1.0)
        from pubswap_flwr.policy.grpo import per_token_logps

        logps = per_token_logps(model, batch.input_ids, batch.attention_mask, batch.completion_ids.shape[1])
    generator = torch.Generator().manual_seed(1)
    old = logps + 0.4 * torch.randn(logps.shape, generator=generator)  # perturbed: clipping must be active
    total_tokens = float(batch.completion_mask.sum())

    model.zero_grad(set_to_none=True)
    ours = micro_batch_loss(model, batch, slice(0, n), advantages, old, None, settings, total_tokens)
    ours.loss.backward()
    assert ours.clip_low > 0 and ours.clip_high > 0, "the test batch must exercise both clip bounds"
    our_grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.requires_grad}

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                      per_device_train_batch_size=n, num_generations=4, beta=0.0, epsilon=0.2, epsilon_high=0.28,
                      loss_type=loss_type, max_completion_length=16, gradient_checkpointing=False, temperature=1.0)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_list([{"prompt": "x"}] * n), processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop, one window here
    inputs = {
        "prompt_ids": batch.prompt_ids, "prompt_mask": batch.prompt_mask,
        "completion_ids": batch.completion_ids, "completion_mask": batch.completion_mask,
        "advantages": advantages, "old_per_token_logps": old,
        "num_items_in_batch": torch.tensor(total_tokens),
    }
    model.zero_grad(set_to_none=True)
    theirs = trainer._compute_loss(trainer.model, inputs)
    theirs.backward()
    assert float(ours.loss) == pytest.approx(float(theirs), abs=1e-6)
    assert abs(float(ours.loss)) > 1e-3, "loss should be non-trivial with perturbed old log-probs"
    worst = max(float((p.grad - our_grads[k]).abs().max()) for k, p in model.named_parameters() if p.requires_grad)
    assert worst < 1e-6
    assert max(float(g.abs().max()) for g in our_grads.values()) > 1e-4
    assert current.clip_low == 0 and current.clip_high == 0  # ratio 1 when old = current
