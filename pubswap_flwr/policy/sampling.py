"""Batched sampling: K completions for each of a batch of prompts in one `generate` call, with per-token log-probs."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_prompt_tokens: int = 256


@dataclass
class Sample:
    """One sampled completion: its ids (through the first EOS, pads removed), text, and per-token log-probs."""

    prompt_index: int
    token_ids: list[int]
    text: str
    logprobs: list[float]
    finished: bool  # ended with EOS (False: cut at max_new_tokens)


def encode_prompts(tokenizer, prompts: list[str], max_prompt_tokens: int) -> dict[str, torch.Tensor]:
    """Left-padded prompt ids; over-long prompts keep their last `max_prompt_tokens` tokens."""
    return tokenizer(prompts, return_tensors="pt", padding=True, truncation=True, max_length=max_prompt_tokens,
                     add_special_tokens=False)


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], *, num_return: int, settings: GenerationSettings,
             greedy: bool = False, with_logprobs: bool = True) -> list[list[Sample]]:
    """`num_return` completions for every prompt (one batched call); result[i] holds prompt i's completions."""
    if not prompts:
        return []
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in encode_prompts(tokenizer, prompts, settings.max_prompt_tokens).items()}
    eos = tokenizer.eos_token_id
    kwargs = dict(
        max_new_tokens=settings.max_new_tokens,
        num_return_sequences=num_return,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos,
        return_dict_in_generate=True,
        output_scores=with_logprobs,
    )
    if greedy:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=True, temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p)
    out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **kwargs)
    prompt_len = batch["input_ids"].shape[1]
    new_tokens = out.sequences[:, prompt_len:]
    if with_logprobs and out.scores:
        # scores are the processed logits the sampler drew from (temperature/top-k applied): their log-softmax
        # at the chosen token is the behaviour log-prob.
        logp = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in out.scores], dim=1)
        chosen = logp.gather(-1, new_tokens[:, : logp.shape[1], None]).squeeze(-1)
    else:
        chosen = None
    results: list[list[Sample]] = [[] for _ in prompts]
    for row in range(new_tokens.shape[0]):
        ids = new_tokens[row].tolist()
        finished = eos in ids
        length = ids.index(eos) + 1 if finished else len(ids)
        ids = ids[:length]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        lps = chosen[row, :length].tolist() if chosen is not None else []
        results[row // num_return].append(Sample(row // num_return, ids, text, lps, finished))
    return results
