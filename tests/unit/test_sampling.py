"""The cached sampler: greedy completions equal Hugging Face generate's in fp32, stop conditions, sampling warpers
as HF applies them, the low-precision sampling copy, and the sampler/trainer log-prob gap."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pubswap_flwr.policy import LoraSettings, Policy, PolicySpec, sampling_precision
from pubswap_flwr.policy.grpo import logprob_gap
from pubswap_flwr.policy.sampling import GenerationSettings, generate, process_logits
from pubswap_flwr.tasks import HeldOutSet, parse_mix
from tests.conftest import perturbed_tiny_policies

MIX = "basic_arithmetic:1,gcd:1,count_bits:1,spell_backward:1"


def _prompts(policy, count: int = 8) -> list[str]:
    items = HeldOutSet.build(parse_mix(MIX), per_task=count).items
    return policy.prompts(items[::max(1, len(items) // count)][:count])


@pytest.fixture(scope="module")
def policies():
    return perturbed_tiny_policies()


@pytest.mark.parametrize("name", ["embedded:tiny", "embedded:tiny-b"])
@pytest.mark.parametrize("max_new", [4, 24])
def test_greedy_completions_equal_generate_in_fp32(policies, name, max_new):
    policy = policies[name]
    prompts = _prompts(policy)
    settings = GenerationSettings(max_new_tokens=max_new)
    with policy.sampler.merged():
        ours = generate(policy.model, policy.tokenizer, prompts, num_return=1, greedy=True, settings=settings)
        theirs = generate(policy.model, policy.tokenizer, prompts, num_return=1, greedy=True,
                          settings=dataclasses.replace(settings, sampler="generate"))
    assert [s[0].token_ids for s in ours] == [s[0].token_ids for s in theirs]
    assert [s[0].finished for s in ours] == [s[0].finished for s in theirs]
    for a, b in zip(ours, theirs):
        assert max((abs(x - y) for x, y in zip(a[0].logprobs, b[0].logprobs)), default=0.0) < 1e-4
    assert any(len(s[0].token_ids) > 1 for s in ours)
    assert any(s[0].finished for s in ours) == (max_new > 4)  # at 4 tokens every answer is cut


def test_stop_conditions_eos_and_token_limit(policies):
    policy = policies["embedded:tiny"]
    eos = policy.tokenizer.eos_token_id
    prompts = _prompts(policy)
    torch.manual_seed(3)
    with policy.sampler.merged():
        rows = generate(policy.model, policy.tokenizer, prompts, num_return=5, settings=GenerationSettings(
            max_new_tokens=12))
    assert [len(r) for r in rows] == [5] * len(prompts)
    samples = [s for r in rows for s in r]
    for s in samples:
        assert len(s.token_ids) == len(s.logprobs) <= 12
        assert all(lp <= 0.0 for lp in s.logprobs)
        if s.finished:  # ends at its first EOS, nothing after it
            assert s.token_ids[-1] == eos and eos not in s.token_ids[:-1]
        else:
            assert len(s.token_ids) == 12 and eos not in s.token_ids
    assert any(s.finished for s in samples)
    with policy.sampler.merged():  # rows that end early leave the batch: the others still run to the limit
        short = generate(policy.model, policy.tokenizer, prompts, num_return=5,
                         settings=GenerationSettings(max_new_tokens=2))
    assert all(len(s.token_ids) <= 2 for r in short for s in r)


def test_sampled_completions_follow_the_prompt_order(policies):
    policy = policies["embedded:tiny"]
    prompts = _prompts(policy, 4)
    torch.manual_seed(0)
    with policy.sampler.merged():
        rows = generate(policy.model, policy.tokenizer, prompts, num_return=3, settings=GenerationSettings(
            max_new_tokens=8))
    assert [[s.prompt_index for s in r] for r in rows] == [[i] * 3 for i in range(4)]


def test_unknown_sampler_is_refused(policies):
    policy = policies["embedded:tiny"]
    with pytest.raises(ValueError, match="generation.sampler must be one of"):
        generate(policy.model, policy.tokenizer, ["x"], num_return=1,
                 settings=GenerationSettings(sampler="vllm"))


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.8), (1.3, 7, 0.6)])
def test_warpers_equal_huggingface(temperature, top_k, top_p):
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1)) * 3
    chain = LogitsProcessorList()
    if temperature != 1.0:
        chain.append(TemperatureLogitsWarper(temperature))
    if top_k:
        chain.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        chain.append(TopPLogitsWarper(top_p))
    expected = chain(torch.zeros(6, 1, dtype=torch.long), logits.clone())
    ours = process_logits(logits, GenerationSettings(temperature=temperature, top_k=top_k, top_p=top_p))
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    finite = ~torch.isinf(ours)
    assert torch.allclose(ours[finite], expected[finite])


def test_low_precision_copy_follows_the_adapter():
    torch.manual_seed(0)
    policy = Policy(PolicySpec(lora=LoraSettings(r=8, alpha=16),
                               generation=GenerationSettings(max_new_tokens=6, dtype="bfloat16")))
    assert policy.sampling_dtype == torch.bfloat16 and policy.sampling_model is not policy.model
    assert all(p.dtype == torch.bfloat16 for p in policy.sampling_model.parameters())
    layer_name, layer = next((n, m) for n, m in policy.model.named_modules() if hasattr(m, "lora_A")
                             and hasattr(m, "base_layer"))
    target = dict(policy.sampling_model.named_modules())[layer_name[len("base_model.model."):]]

    def expected():
        with torch.no_grad():
            return (layer.base_layer.weight + layer.get_delta_weight("default")).to(torch.bfloat16)

    with policy.sampler.merged():
        assert torch.equal(target.weight, expected())
    with torch.no_grad():  # an optimizer step or a new global adapter writes the LoRA weights in place
        layer.lora_B["default"].weight.add_(0.1)
    with policy.sampler.merged():
        assert torch.equal(target.weight, expected())
    fp32 = policy.model.get_base_model()
    assert all(p.dtype == torch.float32 for p in fp32.parameters())  # training stays in fp32


def test_sampling_precision_auto_rules():
    small = torch.nn.Linear(10, 10)
    cpu = torch.device("cpu")
    assert sampling_precision("auto", "float32", small, cpu) == torch.float32  # overhead-bound: no gain
    assert sampling_precision("bfloat16", "float32", small, cpu) == torch.bfloat16
    assert sampling_precision("float32", "bfloat16", small, cpu) == torch.float32
    assert sampling_precision("auto", "bfloat16", small, cpu) == torch.bfloat16
    with pytest.raises(ValueError, match="generation.dtype must be auto or one of"):
        sampling_precision("int8", "float32", small, cpu)


def test_logprob_gap_values():
    training = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.25, 0.0]])
    sampled = torch.tensor([[-1.1, -2.0, -9.0], [-0.5, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    total, worst, count = logprob_gap(training, sampled, mask)
    assert count == 5 and worst == pytest.approx(0.25) and total == pytest.approx(0.35)
    assert logprob_gap(training, sampled, torch.zeros_like(mask)) == (0.0, 0.0, 0)


def test_update_reports_the_sampling_gap_of_own_tokens(policies):
    from pubswap_flwr.rollouts import Behaviour, Completion, RolloutGroup

    torch.manual_seed(0)
    policy = Policy(PolicySpec(lora=LoraSettings(r=8, alpha=16),
                               generation=GenerationSettings(max_new_tokens=8, dtype="bfloat16")))
    prompts = _prompts(policy, 2)
    with policy.sampler.merged():
        rows = generate(policy.sampling_model, policy.tokenizer, prompts, num_return=4,
                        settings=policy.spec.generation)
    groups = [RolloutGroup(p, [Completion(s.text, tuple(s.token_ids), behaviour=Behaviour(tuple(s.token_ids),
                                                                                       tuple(s.logprobs)))
                               for s in row], [1.0, 0.0, 1.0, 0.0]) for p, row in zip(prompts, rows)]
    stats = policy.update(groups)
    tokens = sum(len(s.token_ids) for r in rows for s in r)
    assert stats.extra["sampling_gap_tokens"] == tokens
    mean = stats.extra["sampling_gap_sum"] / tokens
    assert 0 < mean <= stats.extra["sampling_gap_max"] < 1.0  # bf16 sampling vs the fp32 training pass


class _Scripted(torch.nn.Module):
    """A model that always predicts the same continuation of token ids (then keeps repeating its last)."""

    def __init__(self, script: list[int], vocab: int):
        super().__init__()
        self.script, self.vocab = script, vocab
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config = None
        self.calls = 0

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=True,
                logits_to_keep=None):
        token = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        logits = torch.full((input_ids.shape[0], 1, self.vocab), -10.0)
        logits[:, :, token] = 10.0
        return type("Out", (), {"logits": logits})()


def test_stop_at_answer_ends_with_eos_right_after_the_closing_tag(policies, monkeypatch):
    from pubswap_flwr.policy import sampling

    policy = policies["embedded:tiny"]
    tok = policy.tokenizer
    script = tok("<answer>12</answer> and more words", add_special_tokens=False)["input_ids"]
    monkeypatch.setattr(sampling, "decode_cache", lambda model, room: type("C", (), {
        "batch_repeat_interleave": lambda self, n: None, "batch_select_indices": lambda self, i: None})())
    settings = GenerationSettings(max_new_tokens=30, stop_at_answer=True)
    [[stopped]] = generate(_Scripted(script, len(tok)), tok, ["x"], num_return=1, greedy=True, settings=settings)
    assert stopped.finished and stopped.token_ids[-1] == tok.eos_token_id
    assert stopped.text == "<answer>12</answer>" and len(stopped.logprobs) == len(stopped.token_ids)
    [[free]] = generate(_Scripted(script, len(tok)), tok, ["x"], num_return=1, greedy=True,
                        settings=dataclasses.replace(settings, stop_at_answer=False))
    assert free.text.startswith("<answer>12</answer> and more") and not free.finished


def test_a_stop_text_ends_the_completion_with_eos_and_both_endings_apply_together(policies, monkeypatch):
    from pubswap_flwr.policy import sampling

    policy = policies["embedded:tiny"]
    tok = policy.tokenizer
    monkeypatch.setattr(sampling, "decode_cache", lambda model, room: type("C", (), {
        "batch_repeat_interleave": lambda self, n: None, "batch_select_indices": lambda self, i: None})())
    script = tok(" 12.\nQuestion: What is 3 + 4?\nAnswer: 7", add_special_tokens=False)["input_ids"]
    settings = GenerationSettings(max_new_tokens=40)
    [[stopped]] = generate(_Scripted(script, len(tok)), tok, ["x"], num_return=1, greedy=True, settings=settings,
                           stop_text="\nQuestion:")
    assert stopped.finished and stopped.token_ids[-1] == tok.eos_token_id
    assert stopped.text == " 12.\nQuestion:" and len(stopped.logprobs) == len(stopped.token_ids)
    [[free]] = generate(_Scripted(script, len(tok)), tok, ["x"], num_return=1, greedy=True, settings=settings)
    assert free.text.startswith(" 12.\nQuestion: What is 3 + 4?\nAnswer: 7") and not free.finished
    # with stop-at-answer on as well, whichever ending comes first ends the completion
    tagged = tok("<answer>12</answer>\nQuestion: more", add_special_tokens=False)["input_ids"]
    [[first]] = generate(_Scripted(tagged, len(tok)), tok, ["x"], num_return=1, greedy=True,
                         settings=dataclasses.replace(settings, stop_at_answer=True), stop_text="\nQuestion:")
    assert first.text == "<answer>12</answer>" and first.finished


@pytest.mark.parametrize("greedy,k,max_new,room", [(True, 1, 24, 24), (False, 4, 24, 24), (False, 3, 12, 0)])
def test_growing_cache_gives_the_same_completions_as_concatenation(policies, monkeypatch, greedy, k, max_new, room):
    """The decode cache writes in place and hands views to attention: every token and log-prob equals the ones made
    with Hugging Face's concatenating cache, through prompt repeats, rows leaving the batch and (room 0) regrowth."""
    from transformers import DynamicCache

    from pubswap_flwr.policy import sampling

    policy = policies["embedded:tiny"]
    prompts = _prompts(policy)
    settings = GenerationSettings(max_new_tokens=max_new)
    built = []

    def run(make_cache):
        monkeypatch.setattr(sampling, "decode_cache", make_cache)
        torch.manual_seed(5)
        with policy.sampler.merged():
            out = generate(policy.model, policy.tokenizer, prompts, num_return=k, greedy=greedy, settings=settings)
        return [[(s.token_ids, s.logprobs, s.finished) for s in row] for row in out]

    def growing(model, _room):
        cache = decode_cache(model, room)
        built.append(cache)
        return cache

    decode_cache = sampling.decode_cache
    plain = run(lambda model, _room: DynamicCache(config=model.config))
    ours = run(growing)
    assert ours == plain
    lengths = [len(s[0]) for row in ours for s in row]
    assert any(s[2] for row in ours for s in row) and min(lengths) < max(lengths)  # rows left the batch early
    layers = built[0].layers
    assert layers and all(type(layer).__name__ == "GrowingLayer" for layer in layers)
    assert all(layer.keys.shape[-2] == layer.get_seq_length() > 0 for layer in layers)
    assert all(layer.capacity >= layer.length for layer in layers)


def test_growing_layer_crop_reset_and_selection():
    from pubswap_flwr.policy.sampling import growing_layer_class

    layer = growing_layer_class()(room=2)
    first = torch.arange(2 * 1 * 3 * 4, dtype=torch.float32).reshape(2, 1, 3, 4)
    keys, values = layer.update(first, -first)
    assert torch.equal(keys, first) and torch.equal(values, -first) and layer.capacity == 5
    step = torch.full((2, 1, 1, 4), 7.0)
    for _ in range(3):  # the third token goes past the room: the buffer grows, the values stay
        keys, _ = layer.update(step, step)
    assert layer.get_seq_length() == 6 and torch.equal(keys[..., :3, :], first) and bool((keys[..., 3:, :] == 7).all())
    layer.batch_select_indices(torch.tensor([1]))
    assert torch.equal(layer.keys[0, :, :3, :], first[1])
    layer.batch_repeat_interleave(3)
    assert layer.keys.shape[0] == 3 and layer.get_seq_length() == 6
    layer.crop(-2)
    assert layer.get_seq_length() == 4 and layer.keys.shape[-2] == 4
    with pytest.raises(ValueError, match="negative integer"):
        layer.crop(1)
    layer.reset()
    assert layer.get_seq_length() == 0 and not layer.is_initialized


def test_lm_head_takes_a_contiguous_input(policies):
    """With logits_to_keep, the last position's hidden states reach the LM head as a strided view; the hook makes it
    one matrix product (no batched product against a per-sequence copy of the head's weight), with the same logits
    as slicing the full forward's."""
    from torch.profiler import ProfilerActivity, profile

    from pubswap_flwr.policy.model import _contiguous_input

    policy = policies["embedded:tiny"]
    for model in (policy.model.get_base_model(), policy.sampling_model):
        hooks = list(model.get_output_embeddings()._forward_pre_hooks.values())
        assert hooks.count(_contiguous_input) == 1
    batch = policy.tokenizer(_prompts(policy), return_tensors="pt", padding=True)
    model = policy.model.get_base_model()
    with torch.no_grad():
        full = model(**batch).logits[:, -1:, :]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            last = model(**batch, logits_to_keep=1).logits
    assert torch.allclose(last, full, atol=1e-5, rtol=0)
    ops = {event.key for event in prof.key_averages()}
    assert "aten::mm" in ops and "aten::bmm" not in ops


def test_draw_follows_the_probabilities_and_never_draws_a_filtered_token():
    from pubswap_flwr.policy.sampling import draw

    torch.manual_seed(0)
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0], [1e-30, 0.0, 0.0, 0.0, 0.0, 0.0]])
    rows = probs.repeat(20_000, 1)
    tokens = draw(rows).view(20_000, 2)
    counts = torch.bincount(tokens[:, 0], minlength=6).double() / 20_000
    assert counts[[0, 2, 5]].sum() == 0 and bool((tokens[:, 1] == 0).all())  # the only token with any probability
    assert torch.allclose(counts[[1, 3, 4]], torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), atol=0.012)
    unnormalised = torch.tensor([[2.0, 0.0, 6.0]]).repeat(20_000, 1)  # the total need not be 1
    share = (draw(unnormalised) == 2).double().mean()
    assert abs(float(share) - 0.75) < 0.012 and not bool((draw(unnormalised) == 1).any())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_greedy_first_rows_equal_a_greedy_call_and_the_rest_a_sampled_one(policies, monkeypatch, temperature):
    """One prefill per prompt for its greedy and its sampled completions (the held-out evaluation's two passes in
    one): with rows never leaving the batch early, the greedy rows equal a greedy call's tokens and log-probs and the
    sampled rows a sampled call's from the same seed (they draw the same uniforms; greedy rows draw none)."""
    from pubswap_flwr.policy import sampling

    monkeypatch.setattr(sampling, "COMPACT_FRACTION", 2.0)
    policy = policies["embedded:tiny"]
    prompts = _prompts(policy)
    settings = GenerationSettings(max_new_tokens=24, temperature=temperature)

    def run(k, greedy=False, greedy_first=0):
        torch.manual_seed(9)
        with policy.sampler.merged():
            out = generate(policy.model, policy.tokenizer, prompts, num_return=k, greedy=greedy, settings=settings,
                           greedy_first=greedy_first)
        return [[(s.token_ids, s.finished) for s in row] for row in out], \
            [[s.logprobs for s in row] for row in out]

    (mixed, mixed_logps), (alone, alone_logps) = run(4, greedy_first=1), run(1, greedy=True)
    sampled, sampled_logps = run(3)
    assert [row[:1] for row in mixed] == alone and [row[1:] for row in mixed] == sampled
    for got, want in zip([row[:1] for row in mixed_logps] + [row[1:] for row in mixed_logps],
                         alone_logps + sampled_logps):
        assert torch.allclose(torch.tensor(sum(got, [])), torch.tensor(sum(want, [])), atol=1e-5)
    assert any(row[1:] != row[:1] * 3 for row in mixed)  # the sampled rows are not greedy copies
    assert run(4, greedy_first=4)[0] == run(4, greedy=True)[0]  # every row greedy: a greedy call
    assert run(4, greedy_first=0)[0] == run(4)[0]


def test_greedy_first_is_checked(policies):
    policy = policies["embedded:tiny"]
    settings = GenerationSettings(max_new_tokens=4)
    with pytest.raises(ValueError, match="greedy_first must be between 0 and num_return \\(2\\), got 3"):
        generate(policy.model, policy.tokenizer, ["x"], num_return=2, settings=settings, greedy_first=3)
    with pytest.raises(ValueError, match="greedy_first needs generation.sampler = \"cached\""):
        generate(policy.model, policy.tokenizer, ["x"], num_return=2, greedy_first=1,
                 settings=dataclasses.replace(settings, sampler="generate"))


def test_prompt_seeds_make_each_prompt_s_samples_its_own(policies):
    """With prompt_seeds, a prompt's sampled completions depend on its seed alone: the same in a batch of 8, alone,
    in another order, and after its greedy completion (greedy_first); the global generator is neither read nor
    moved."""
    policy = policies["embedded:tiny"]
    prompts = _prompts(policy)
    seeds = [1000 + i for i in range(len(prompts))]
    settings = GenerationSettings(max_new_tokens=16, temperature=1.0)

    def run(chosen, seed_list, **kw):
        with policy.sampler.merged():
            out = generate(policy.model, policy.tokenizer, chosen, num_return=3, settings=settings,
                           prompt_seeds=seed_list, **kw)
        return [[s.token_ids for s in row] for row in out]

    state = torch.get_rng_state()
    together = run(prompts, seeds)
    assert torch.equal(torch.get_rng_state(), state)
    alone = [run([p], [s])[0] for p, s in zip(prompts, seeds)]
    backwards = run(prompts[::-1], seeds[::-1])[::-1]
    assert together == alone == backwards
    with_greedy = run(prompts, seeds, greedy_first=1)
    assert [row[1:] for row in with_greedy] == [row[:2] for row in together]  # sample k draws stream k either way
    assert run(prompts, [s + 1 for s in seeds]) != together  # other seeds, other samples
    assert any(len(set(map(tuple, row))) > 1 for row in together)  # the samples of a prompt differ


def test_prompt_seeds_are_checked(policies):
    policy = policies["embedded:tiny"]
    settings = GenerationSettings(max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt_seeds holds 1 seeds for 2 prompts"):
        generate(policy.model, policy.tokenizer, ["x", "y"], num_return=2, settings=settings, prompt_seeds=[1])
    with pytest.raises(ValueError, match="per-prompt random streams \\(prompt_seeds\\) need generation.sampler"):
        generate(policy.model, policy.tokenizer, ["x"], num_return=2, prompt_seeds=[1],
                 settings=dataclasses.replace(settings, sampler="generate"))


def test_row_streams_follow_the_seed_and_the_sample_index():
    from pubswap_flwr.policy.sampling import row_streams

    rows = row_streams([5, 6], num_return=3, greedy_first=1, steps=4)
    assert rows.shape == (6, 4) and rows.dtype == torch.float64 and bool(((rows >= 0) & (rows < 1)).all())
    assert torch.equal(rows[1], row_streams([5], 2, 0, 4)[0])  # prompt 5's first sample after its greedy row
    assert torch.equal(rows[2], row_streams([5], 2, 0, 4)[1]) and torch.equal(rows[5], row_streams([6], 2, 0, 4)[1])
    assert not torch.equal(rows[1], rows[4])
