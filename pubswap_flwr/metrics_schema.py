"""The metrics.jsonl row's shared key names, each spelled once: the runner, the round log and the protocols write
rows with them, and progress lines, the report, the trackers and the model cards read them (docs/protocols.md
describes every field). A key only one protocol writes and nothing else reads by name (fedavg's `robust`, pubswap's
`public_steps`, sapo's `packets_rejected`, a counter block's keys, which its Struct's `rename` gives) is spelled in
that protocol's module. Imports nothing, so readers of finished runs load neither Flower nor torch through it."""

from __future__ import annotations

from typing import Final

# -- a round's row -------------------------------------------------------------------------------------------------
ROUND: Final = "round"
MODE: Final = "mode"
EVAL: Final = "eval"  # held-out metrics of the global adapter (sapo: the mean of the nodes' self-reported ones)
NODE_EVAL: Final = "node_eval"  # sapo: each node's own held-out metrics
TRAIN_REWARD: Final = "train_reward"  # mean over clients of their mean reward this round
CUMULATIVE_REWARD: Final = "cumulative_reward"
CLIENTS: Final = "clients"  # Flower node id -> the client's row (below)
DROPPED: Final = "dropped"  # Flower node id -> why
TIME: Final = "time"
SAMPLING_S: Final = "sampling_s"  # in TIME: the clients' summed seconds spent sampling their own rollouts this round
BYTES: Final = "bytes"
PARAMETER_DRIFT: Final = "parameter_drift"
KEPT_REASON: Final = "kept_reason"  # why an averaging round kept the global adapter (`aggregated` false)
UNTRAINED_CLIENTS: Final = "untrained_clients"  # replies left out of the aggregate: they trained on no examples
SWAP: Final = "swap"  # pubswap: the round's summary of its public steps
SERVER_OPTIMIZER: Final = "server_optimizer"
# the mean over clients of their ZERO_ADVANTAGE_SHARE (below); in SWAP, and per public prompt in a public step, the
# share of the clients' groups with equal rewards before and after the swap
ZERO_ADVANTAGE_SHARE: Final = "zero_advantage_share"
ZERO_ADVANTAGE_BEFORE_SWAP: Final = "zero_advantage_before_swap"
ZERO_ADVANTAGE_AFTER_SWAP: Final = "zero_advantage_after_swap"
# in SWAP (summed over the round's public steps) and per public step: each client's public groups (one per prompt)
# whose rewards differ, before and after the swap ({client label: count}): the groups a public step can learn from
MIXED_GROUPS_BEFORE_SWAP: Final = "mixed_groups_before_swap"
MIXED_GROUPS_AFTER_SWAP: Final = "mixed_groups_after_swap"

# -- the held-out metrics in EVAL / NODE_EVAL ---------------------------------------------------------------------
GREEDY_ACCURACY: Final = "greedy_accuracy"
SAMPLED_ACCURACY: Final = "sampled_accuracy"
SAMPLED_REWARD: Final = "sampled_reward"
CONSTANT_ACCURACY: Final = "constant_accuracy"  # per task: the best constant answer's accuracy on the same items
SHORTCUT_TASKS: Final = ("greedy_shortcut_tasks", "sampled_shortcut_tasks")  # tasks whose answers collapsed (shortcuts)
HARDER_TIER: Final = "harder_tier"  # eval.harder-tier: the same metrics on the harder tier, inside EVAL
ITEM_RESULTS: Final = "item_results"  # evaluate()'s per-item correct counts: written to eval_items.jsonl, not the row

# -- a client's row in CLIENTS -------------------------------------------------------------------------------------
NODE_INDEX: Final = "node_index"
ROLLOUT_REWARD: Final = "rollout_reward"  # sapo: the mean reward of the node's own rollouts (TRAIN_REWARD otherwise)
WELL_FORMED: Final = "well_formed"  # share of the node's own samples that kept the answer format
FOREIGN_WEIGHT_MEAN: Final = "foreign_weight_mean"  # train.foreign-correction: mean loss weight of foreign tokens,
IS_CAPPED_FRACTION: Final = "is_capped_fraction"  # the share truncated at train.is-cap,
FOREIGN_FALLBACKS: Final = "foreign_fallbacks"  # foreign completions without a usable donor behaviour
CURRICULUM_LEVELS: Final = "curriculum_levels"  # tasks.curriculum: task -> the level of the node's private items
TRAINED_GROUPS: Final = "trained_groups"  # groups in the node's GRPO updates this round,
ZERO_ADVANTAGE_GROUPS: Final = "zero_advantage_groups"  # of them, those whose rewards were all equal (no signal),
# and their share (ZERO_ADVANTAGE_SHARE, the same key as the row's mean over clients)
EXTERNAL_USABLE: Final = "external_usable"  # sapo: received groups that passed the receiver's re-scoring and differ
EXTERNAL_ZERO_ADVANTAGE_SHARE: Final = "external_zero_advantage_share"  # sapo: of the received groups it scored
# train.dynamic-sampling: a node's private groups sampled and trained this round, trained / (steps x prompts-per-step),
# sampled / (steps x prompts-per-step) (1: no extra sampling), and the steps skipped with no group whose rewards differ
DYNAMIC_GROUPS_SAMPLED: Final = "dynamic_groups_sampled"
DYNAMIC_GROUPS_TRAINED: Final = "dynamic_groups_trained"
DYNAMIC_FILLED_SHARE: Final = "dynamic_filled_share"
DYNAMIC_SAMPLING_FACTOR: Final = "dynamic_sampling_factor"
DYNAMIC_STEPS_SKIPPED: Final = "dynamic_steps_skipped"
PROMPTS_SKIPPED: Final = "prompts_skipped"  # train.skip-equal-prompts: private prompts skipped before rollout

WELL_FORMED_WARNING: Final = 0.8  # below this WELL_FORMED share a client is warned about (and the report says so)
