"""Batched sampling: K completions for each of a batch of prompts, with per-token log-probs.

Two samplers give the same distribution (`generation.sampler`):
- "cached" (default): our own decode loop over a KV cache. Each distinct prompt is prefilled once and its cache
  copied for its K completions (`generate` prefills all K copies), rows that have emitted EOS leave the batch as soon
  as they are a quarter of it (`generate` keeps decoding pad for them until the last row ends), and nothing else runs
  per step: one forward, temperature / top-k / top-p as Hugging Face applies them, one draw (by inverse CDF:
  `draw`). Each layer's keys and values go into a buffer with room for the whole completion (`GrowingLayer`), not a
  new concatenated copy per token, and finished rows leave it in place (`keep_rows`). Each step's forward is
  `decode_step.DecodeStep` for Llama-family models (the same operations as Hugging Face's forward without its
  per-call Python; `GenerationSettings.decode_step = False` or an unsupported model: Hugging Face's; `compile_step`:
  its elementwise kernels through torch.compile), and the attention mask is a preallocated buffer viewed per step.
- "generate": Hugging Face's `model.generate` (the reference: greedy completions of both are equal in fp32).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Sequence

import torch

from ..settings import GenerationSettings as GenerationSettings  # declared there, light; re-exported
from .decode_step import DecodeStep

SAMPLERS = ("cached", "generate")
COMPACT_FRACTION = 0.25  # drop finished rows from the decode batch once they are this share of it
ANSWER_CLOSE = "</answer>"
TAIL_TOKENS = 8  # how many of a row's last tokens TextEnd decodes: more than any ending takes


class TextEnd:
    """Which rows have just written one of `endings` (the closing answer tag, a plain prompt's next question): the
    tail of a row's text is decoded only when its newest token holds the last character of an ending, so the check
    costs nothing on most steps."""

    def __init__(self, tokenizer, endings: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.endings = tuple(ending for ending in endings if ending)
        self._last_chars = {ending[-1] for ending in self.endings}
        self._can_end: dict[int, bool] = {}

    def ended(self, ids: list[int]) -> bool:
        token = ids[-1]
        if token not in self._can_end:
            text = self.tokenizer.decode([token])
            self._can_end[token] = any(char in text for char in self._last_chars)
        return self._can_end[token] and self.tokenizer.decode(ids[-TAIL_TOKENS:]).rstrip().endswith(self.endings)


def keep_rows(buffer: torch.Tensor, indices: torch.Tensor, length: int) -> torch.Tensor:
    """`buffer[indices]` (rows x heads x capacity x head size) where the first `length` positions hold keys or values.
    A compaction (`indices` increasing: finished rows leave) is made in place: each row after the first that left
    moves up by one copy of its filled positions (a row is read before any later row lands on it), and the buffer's
    first rows are returned as a view, so nothing of the whole capacity is allocated or gathered. Other orders gather
    as indexing does."""
    rows = indices.tolist()
    if any(later <= earlier for earlier, later in zip(rows, rows[1:])) or (rows and rows[0] < 0):
        return buffer[indices, ...]
    for new, old in enumerate(rows):
        if new != old:
            buffer[new, :, :length].copy_(buffer[old, :, :length])
    return buffer[:len(rows)]


@functools.cache
def growing_layer_class():
    """`GrowingLayer`, defined on first use so that importing this module does not import transformers."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A decoder layer's keys and values in a buffer with room for `room` more tokens past what it was first
        given. Hugging Face's DynamicLayer concatenates a new copy of the whole cache at every token, which is
        quadratic in the completion's length (15% of an evaluation's time on SmolLM2); here each token is written
        in place and the layer's `keys` / `values` are views of the filled part, holding the same values."""

        def __init__(self, room: int):
            super().__init__()
            self.room = room
            self.length = 0  # tokens held
            self.capacity = 0  # tokens the buffers have room for
            self._keys = self._values = torch.empty(0)

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self.capacity:
                self._grow(end + self.room, key_states, value_states)
            self._keys[..., self.length:end, :] = key_states
            self._values[..., self.length:end, :] = value_states
            self.length = end
            self._view()
            return self.keys, self.values

        def _grow(self, capacity: int, key_states, value_states) -> None:
            keys = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
            values = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
            if self.length:
                keys[..., :self.length, :] = self._keys[..., :self.length, :]
                values[..., :self.length, :] = self._values[..., :self.length, :]
            self._keys, self._values, self.capacity = keys, values, capacity

        def _view(self) -> None:
            self.keys = self._keys[..., :self.length, :]
            self.values = self._values[..., :self.length, :]

        def get_seq_length(self) -> int:
            return self.length

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.length:
                self._keys = self._keys.repeat_interleave(repeats, dim=0)
                self._values = self._values.repeat_interleave(repeats, dim=0)
                self._view()

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.length:
                self._keys = keep_rows(self._keys, indices, self.length)
                self._values = keep_rows(self._values, indices, self.length)
                self._view()

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError(f"crop takes the number of tokens to remove as a negative integer, "
                                 f"got {tokens_to_remove}")
            if self.length:
                self.length = max(0, self.length + tokens_to_remove)
                self._view()

        def reset(self) -> None:
            self._keys = self._values = torch.empty(0)
            self.length = self.capacity = 0
            super().reset()

    return GrowingLayer


def decode_cache(model, room: int):
    """A DynamicCache for `model` whose full-attention layers are GrowingLayers with `room` tokens to spare after
    the prefill (sliding-window layers stay as Hugging Face makes them)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    layer = growing_layer_class()
    cache.layers = [layer(room) if type(old) is DynamicLayer else old for old in cache.layers]
    return cache


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


def process_logits(logits: torch.Tensor, settings: GenerationSettings) -> torch.Tensor:
    """Hugging Face's sampling warpers in its order (temperature, top-k, top-p); filtered tokens get -inf. The
    log-softmax of the result at the drawn token is the behaviour log-prob."""
    scores = logits.to(torch.float32, copy=True)  # a copy even of float32 logits: divided in place below
    if settings.temperature != 1.0:
        scores.div_(settings.temperature)  # the same values as scores / T, without a second vocabulary-wide tensor
    if 0 < settings.top_k < scores.shape[-1]:
        kth = torch.topk(scores, settings.top_k, dim=-1).values[..., -1, None]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if settings.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - settings.top_p)
        remove_sorted[..., -1:] = False  # keep at least one token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


def draw(probs: torch.Tensor, uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of `probs` (rows x vocabulary) by inverse CDF: one uniform per row against the row's
    cumulative probabilities. torch.multinomial draws an exponential for every vocabulary entry (49,152 a row for
    SmolLM2: 0.52 s a decode step at 192 rows on one thread, as long as the step's forward); this is one number a row
    and a cumulative sum (0.04 s), from the same distribution. A token of probability 0 is never drawn: the uniform
    stays below the row's total, so the first cumulative sum above it belongs to a token that adds to it.
    `uniforms` (one per row in [0, 1)): each row's own draw (per-row streams: `row_streams`) instead of the global
    generator's."""
    # the sum in float64 (cumsum's dtype casts the probabilities first, as .to(float64) did: the same values)
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64 if probs.device.type != "mps" else torch.float32)
    total = cdf[:, -1:]
    if uniforms is None:
        uniforms = torch.rand(total.shape, dtype=cdf.dtype, device=cdf.device)
    u = uniforms.reshape(total.shape).to(cdf.dtype) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True).squeeze(1)


def _to_samples(tokenizer, rows_ids: list[list[int]], rows_logps: list[list[float]] | None, num_return: int,
                eos: int) -> list[list[Sample]]:
    count = len(rows_ids) // num_return
    results: list[list[Sample]] = [[] for _ in range(count)]
    for row, ids in enumerate(rows_ids):
        finished = eos in ids
        length = ids.index(eos) + 1 if finished else len(ids)
        ids = ids[:length]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        lps = rows_logps[row][:length] if rows_logps is not None else []
        results[row // num_return].append(Sample(row // num_return, ids, text, lps, finished))
    return results


def _generate_hf(model, tokenizer, batch: dict[str, torch.Tensor], num_return: int, settings: GenerationSettings,
                 greedy: bool, with_logprobs: bool) -> tuple[list[list[int]], list[list[float]] | None]:
    kwargs = dict(max_new_tokens=settings.max_new_tokens, num_return_sequences=num_return,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                  return_dict_in_generate=True, output_scores=with_logprobs)
    if greedy:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=True, temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p)
    out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **kwargs)
    new_tokens = out.sequences[:, batch["input_ids"].shape[1]:]
    chosen = None
    if with_logprobs and out.scores:
        # scores are the processed logits the sampler drew from: their log-softmax at the chosen token
        logp = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in out.scores], dim=1)
        chosen = logp.gather(-1, new_tokens[:, : logp.shape[1], None]).squeeze(-1).tolist()
    return new_tokens.tolist(), chosen


def _choose(logits: torch.Tensor, greedy_rows: torch.Tensor, settings: GenerationSettings,
            with_scores: bool, uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(scores, chosen token) of each row: greedy rows take the argmax of their logits (an argmax in the logits' own
    dtype: converting to float32 is exact and keeps the order), the others a draw from their processed logits
    (`process_logits`; `uniforms`, one per row, its draw: see `draw`). The scores, what each row's log-prob is taken
    from, only `with_scores` (else None)."""
    if bool(greedy_rows.all()):
        return (logits.float() if with_scores else None), logits.argmax(dim=-1)
    if not bool(greedy_rows.any()):
        scores = process_logits(logits, settings)
        return (scores if with_scores else None), draw(scores.softmax(dim=-1), uniforms)
    sampled, greedy = (~greedy_rows).nonzero().squeeze(1), greedy_rows.nonzero().squeeze(1)
    chosen = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    chosen[greedy] = logits[greedy].argmax(dim=-1)
    processed = process_logits(logits[sampled], settings)
    chosen[sampled] = draw(processed.softmax(dim=-1), None if uniforms is None else uniforms[sampled])
    return (logits.float().index_copy(0, sampled, processed) if with_scores else None), chosen


def row_streams(prompt_seeds: Sequence[int], num_return: int, greedy_first: int, steps: int) -> torch.Tensor:
    """Each row's own uniforms for `steps` decode steps (rows x steps, float64), rows in generate's order: the k-th
    sampled completion of a prompt (counting after its `greedy_first` greedy ones) draws from a generator seeded by
    (its prompt's seed, k), so what a prompt's samples are depends on its seed alone, not on the prompts beside it,
    the batch size or whether its greedy completion is decoded with them."""
    rows = []
    for seed in prompt_seeds:
        for index in range(num_return):
            k = max(index - greedy_first, 0)
            generator = torch.Generator().manual_seed(stream_seed(seed, k))
            rows.append(torch.rand(steps, dtype=torch.float64, generator=generator))
    return torch.stack(rows) if rows else torch.empty(0, steps, dtype=torch.float64)


def stream_seed(*parts: object) -> int:
    """A 63-bit seed from `parts` (sha256 of their text): the same parts give the same seed on every machine."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


# parameters: generate's options, passed on unchanged
def _generate_cached(model, tokenizer, batch: dict[str, torch.Tensor], num_return: int,
                     settings: GenerationSettings, greedy: bool, with_logprobs: bool,
                     greedy_first: int = 0, prompt_seeds: Sequence[int] | None = None, stop_text: str = ""
                     ) -> tuple[list[list[int]], list[list[float]] | None]:
    eos = tokenizer.eos_token_id
    ids, mask = batch["input_ids"], batch["attention_mask"]
    # positions as generate makes them for left padding: pads at 0, tokens counted from the first real one
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    cache = decode_cache(model, settings.max_new_tokens)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                logits_to_keep=1)
    logits = out.logits[:, -1, :]
    if num_return > 1:  # one prefill per prompt; its cache copied for each completion, rows in generate's order
        cache.batch_repeat_interleave(num_return)
        logits = logits.repeat_interleave(num_return, dim=0)
        mask = mask.repeat_interleave(num_return, dim=0)
        positions = positions.repeat_interleave(num_return, dim=0)
    rows = logits.shape[0]
    layers = getattr(cache, "layers", ())
    step_forward = DecodeStep.for_model(model, settings.compile_step) if settings.decode_step and layers and all(
        isinstance(layer, growing_layer_class()) for layer in layers) else None
    # every row's attention mask over the cache, with room for the whole completion (new tokens are never padding)
    prompt_length = mask.shape[1]
    attention = torch.ones(rows, prompt_length + settings.max_new_tokens, dtype=torch.bool, device=ids.device)
    attention[:, :prompt_length] = mask.bool()
    padded = not bool(attention[:, :prompt_length].all())
    greedy_rows = torch.arange(rows, device=ids.device) % num_return < (num_return if greedy else greedy_first)
    last_position = positions[:, -1:]
    active = torch.arange(rows, device=ids.device)  # original row of each row still in the decode batch
    tokens: list[list[int]] = [[] for _ in range(rows)]
    logps: list[list[float]] | None = [[] for _ in range(rows)] if with_logprobs else None
    finished = torch.zeros(rows, dtype=torch.bool, device=ids.device)  # by current batch row
    endings = ((ANSWER_CLOSE,) if settings.stop_at_answer else ()) + ((stop_text,) if stop_text else ())
    ender = TextEnd(tokenizer, endings) if endings else None
    closed = torch.zeros(rows, dtype=torch.bool, device=ids.device)  # by current batch row: EOS comes next
    streams = (row_streams(prompt_seeds, num_return, greedy_first, settings.max_new_tokens).to(ids.device)
               if prompt_seeds is not None and not greedy else None)
    for step in range(settings.max_new_tokens):
        scores, chosen = _choose(logits, greedy_rows, settings, with_logprobs,
                                 None if streams is None else streams[active, step])
        # EOS follows a closed answer (generation.stop-at-answer) or the stop text (its log-prob is the model's own)
        chosen = torch.where(closed, torch.full_like(chosen, eos), chosen)
        chosen = torch.where(finished, torch.full_like(chosen, tokenizer.pad_token_id), chosen)
        step_logps = (torch.log_softmax(scores, dim=-1).gather(-1, chosen[:, None]).squeeze(-1).tolist()
                      if scores is not None else None)
        for row, (original, token) in enumerate(zip(active.tolist(), chosen.tolist())):
            if finished[row]:
                continue
            tokens[original].append(token)
            if logps is not None and step_logps is not None:
                logps[original].append(step_logps[row])
        finished = finished | (chosen == eos)
        if ender is not None:
            closed = torch.tensor([not done and ender.ended(tokens[original]) for done, original
                                   in zip(finished.tolist(), active.tolist())], dtype=torch.bool, device=ids.device)
        if bool(finished.all()) or step + 1 == settings.max_new_tokens:
            break
        if int(finished.sum()) >= max(1, COMPACT_FRACTION * finished.numel()):
            keep = (~finished).nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            active, attention, last_position, chosen = active[keep], attention[keep], last_position[keep], chosen[keep]
            finished, closed, greedy_rows = finished[keep], closed[keep], greedy_rows[keep]
            padded = not bool(attention[:, :prompt_length].all())
        last_position = last_position + 1
        length = prompt_length + step + 1  # the cache's tokens once this step's are in
        if step_forward is not None:
            logits = step_forward(chosen, last_position, cache, attention[:, :length] if padded else None)
        else:
            out = model(input_ids=chosen[:, None], attention_mask=attention[:, :length].to(mask.dtype),
                        position_ids=last_position, cache=cache, use_cache=True)
            logits = out.logits[:, -1, :]
    return tokens, logps


# parameters: the sampler's options, keyword-only with their defaults
@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], *, num_return: int, settings: GenerationSettings,
             greedy: bool = False, with_logprobs: bool = True, greedy_first: int = 0,
             prompt_seeds: Sequence[int] | None = None, stop_text: str = "") -> list[list[Sample]]:
    """`num_return` completions for every prompt (one batched call); result[i] holds prompt i's completions.
    `greedy_first` (cached sampler only): the first that many of each prompt's completions are greedy and the rest
    sampled, all from one prefill of the prompt (the held-out evaluation's greedy and sampled passes in one).
    `prompt_seeds` (cached sampler only; one per prompt): each prompt's samples draw from streams of its own seed
    (`row_streams`), not from the global generator, so they do not depend on how prompts are batched.
    `stop_text` (cached sampler only): a completion that writes it ends there, EOS following as with
    `settings.stop_at_answer` (a plain prompt's next question: a base model goes on with questions of its own)."""
    if not prompts:
        return []
    if prompt_seeds is not None and len(prompt_seeds) != len(prompts):
        raise ValueError(f"prompt_seeds holds {len(prompt_seeds)} seeds for {len(prompts)} prompts")
    if settings.sampler not in SAMPLERS:
        raise ValueError(f"generation.sampler must be one of {SAMPLERS}, got {settings.sampler!r}")
    if not 0 <= greedy_first <= num_return:
        raise ValueError(f"greedy_first must be between 0 and num_return ({num_return}), got {greedy_first}")
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in encode_prompts(tokenizer, prompts, settings.max_prompt_tokens).items()}
    if settings.sampler == "cached":
        ids, logps = _generate_cached(model, tokenizer, batch, num_return, settings, greedy, with_logprobs,
                                      greedy_first, prompt_seeds, stop_text)
    elif greedy_first and not greedy:
        raise ValueError("greedy_first needs generation.sampler = \"cached\" (generate draws every row alike)")
    elif prompt_seeds is not None and not greedy:
        raise ValueError("per-prompt random streams (prompt_seeds) need generation.sampler = \"cached\" (Hugging "
                         "Face's generate draws from the global generator)")
    else:
        ids, logps = _generate_hf(model, tokenizer, batch, num_return, settings, greedy, with_logprobs)
    return _to_samples(tokenizer, ids, logps, num_return, tokenizer.eos_token_id)
