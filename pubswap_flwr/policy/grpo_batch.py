"""A GRPO batch: rollout groups tokenized into one left-padded prompt + right-padded completion batch, with
rewards, group sizes, which completions are foreign or truncated, and the sampling log-probs they carry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..rollouts import RolloutGroup
from .sampling import GenerationSettings


@dataclass
class Batch:
    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor  # (B, C) right-padded
    completion_mask: torch.Tensor
    rewards: torch.Tensor  # (B,)
    group_sizes: list[int]
    foreign: torch.Tensor  # (B,) bool
    truncated: torch.Tensor  # (B,) bool: the completion ends in neither EOS nor pad (cut at the token limit)
    donor_logps: torch.Tensor | None = None  # (B, C) the donors' sampling log-probs (0 where there is none)
    has_behaviour: torch.Tensor | None = None  # (B,) bool: the row's tokens are a donor's with its log-probs
    sampled_logps: torch.Tensor | None = None  # (B, C) own rows: the log-probs the sampler drew them with (else 0)
    has_sampled: torch.Tensor | None = None  # (B,) bool: an own row with its sampler's log-probs

    def to(self, device: torch.device) -> "Batch":
        optional = [None if t is None else t.to(device) for t in
                    (self.donor_logps, self.has_behaviour, self.sampled_logps, self.has_sampled)]
        return Batch(self.prompt_ids.to(device), self.prompt_mask.to(device), self.completion_ids.to(device),
                     self.completion_mask.to(device), self.rewards.to(device), self.group_sizes,
                     self.foreign.to(device), self.truncated.to(device), *optional)

    def without_truncated(self) -> "Batch":
        """TRL's mask_truncated_completions: truncated completions' tokens leave the completion mask (the loss, the
        DAPO token count and, as in TRL, attention over those tokens)."""
        mask = self.completion_mask * (~self.truncated).unsqueeze(1).to(self.completion_mask.dtype)
        return Batch(self.prompt_ids, self.prompt_mask, self.completion_ids, mask, self.rewards, self.group_sizes,
                     self.foreign, self.truncated, self.donor_logps, self.has_behaviour, self.sampled_logps,
                     self.has_sampled)

    def rows(self, index: torch.Tensor) -> "Batch":
        """The rows `index`, without the padding columns none of them uses (prompts are left-padded, completions
        right-padded), so a forward over them computes nothing for dropped rows or their padding."""
        prompt_mask, completion_mask = self.prompt_mask[index], self.completion_mask[index]
        used = prompt_mask.any(0).nonzero()
        first = int(used[0]) if len(used) else prompt_mask.shape[1] - 1
        used = completion_mask.any(0).nonzero()
        end = int(used[-1]) + 1 if len(used) else 1
        pick = lambda t: None if t is None else t[index]
        cut = lambda t: None if t is None else t[index, :end]
        return Batch(self.prompt_ids[index, first:], prompt_mask[:, first:], self.completion_ids[index, :end],
                     completion_mask[:, :end], self.rewards[index], [], self.foreign[index], self.truncated[index],
                     cut(self.donor_logps), pick(self.has_behaviour), cut(self.sampled_logps), pick(self.has_sampled))

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)


def encode_completion(tokenizer, completion, max_tokens: int) -> list[int]:
    """Own samples: their sampled ids; foreign ones with an accepted behaviour: the donor's sampled ids. Other
    foreign text: local ids + EOS. Truncated to `max_tokens`."""
    if completion.token_ids is not None:
        ids = list(completion.token_ids)
    elif completion.behaviour is not None:
        ids = list(completion.behaviour.ids)
    else:
        ids = tokenizer(completion.text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return ids[:max_tokens]


def build_batch(tokenizer, groups: Sequence[RolloutGroup], generation: GenerationSettings) -> Batch:
    """Prompts truncated to the generation's prompt limit, completions to its new-token limit (the same limits
    sampling used, so own and foreign members of a group are cut alike)."""
    prompts: list[str] = []
    completions: list[list[int]] = []
    rewards: list[float] = []
    foreign: list[bool] = []
    truncated: list[bool] = []
    sizes: list[int] = []
    behaviours: dict[int, list[float]] = {}  # row -> the donor's log-probs of its ids
    sampled: dict[int, list[float]] = {}  # own row -> its sampler's log-probs
    ends = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    for group in groups:
        sizes.append(len(group.completions))
        for completion, reward in zip(group.completions, group.rewards):
            prompts.append(group.prompt)
            ids = encode_completion(tokenizer, completion, generation.max_new_tokens)
            if completion.token_ids is None and completion.behaviour is not None and ids:
                behaviours[len(completions)] = list(completion.behaviour.logprobs[:len(ids)])
            elif (completion.token_ids is not None and completion.behaviour is not None and ids
                  and tuple(completion.behaviour.ids[:len(ids)]) == tuple(ids)):
                sampled[len(completions)] = list(completion.behaviour.logprobs[:len(ids)])
            completions.append(ids if ids else [tokenizer.eos_token_id])
            rewards.append(float(reward))
            foreign.append(not completion.is_own)
            truncated.append(completions[-1][-1] not in ends)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, truncation=True,
                    max_length=generation.max_prompt_tokens, add_special_tokens=False)
    width = max(len(c) for c in completions)
    pad = tokenizer.pad_token_id
    comp_ids = torch.full((len(completions), width), pad, dtype=torch.long)
    comp_mask = torch.zeros((len(completions), width), dtype=torch.long)
    for row, ids in enumerate(completions):
        comp_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        comp_mask[row, : len(ids)] = 1
    donor_logps, has_behaviour = _row_logps(behaviours, len(completions), width)
    sampled_logps, has_sampled = _row_logps(sampled, len(completions), width)
    return Batch(enc["input_ids"], enc["attention_mask"], comp_ids, comp_mask,
                 torch.tensor(rewards, dtype=torch.float32), sizes, torch.tensor(foreign), torch.tensor(truncated),
                 donor_logps, has_behaviour, sampled_logps, has_sampled)


def _row_logps(rows: dict[int, list[float]], count: int,
               width: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(count, width) log-probs with the given rows filled (0 elsewhere) and which rows have them; None if none."""
    if not rows:
        return None, None
    logps = torch.zeros((count, width), dtype=torch.float32)
    present = torch.zeros(count, dtype=torch.bool)
    for row, values in rows.items():
        logps[row, : len(values)] = torch.tensor(values, dtype=torch.float32)
        present[row] = True
    return logps, present


ANSWER_TAGS = ("<answer>", "</answer>")


def tag_token_mask(tokenizer, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                   rows: torch.Tensor) -> torch.Tensor:
    """(B, C) bool: the tokens of rows `rows` (a bool per row, e.g. the foreign ones) that spell part of an answer tag
    ("<answer>" or "</answer>"), found by decoding each token in turn so any tokenizer's split of a tag counts."""
    mask = torch.zeros_like(completion_mask, dtype=torch.bool)
    for row in rows.nonzero().flatten().tolist():
        ids = completion_ids[row][completion_mask[row].bool()].tolist()
        starts, text = [], ""
        for token in ids:
            starts.append(len(text))
            text += tokenizer.decode([token], skip_special_tokens=False)
        spans = [(at, at + len(tag)) for tag in ANSWER_TAGS for at in _occurrences(text, tag)]
        for index, start in enumerate(starts):
            end = starts[index + 1] if index + 1 < len(starts) else len(text)
            if end > start and any(start < high and end > low for low, high in spans):
                mask[row, index] = True
    return mask


def _occurrences(text: str, tag: str) -> list[int]:
    found, at = [], text.find(tag)
    while at >= 0:
        found.append(at)
        at = text.find(tag, at + 1)
    return found
