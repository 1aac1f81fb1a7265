"""Watch one node's GRPO training for the answer-format collapse: reward, held-out accuracy and completion shapes.

    python scripts/collapse_probe.py --steps 120 --every 10 train.learning-rate=0.01

Trains a single learner (no Flower) on its private stream with the given config overrides and, every `--every` steps,
prints: the training batch's mean reward, its exact-correct fraction and partial-credit fraction (0 < reward < 1),
the shape of its completions (well formed: exactly one <answer>...</answer> and nothing after it; extra closing tags;
no answer), held-out sampled and greedy accuracy, and the commonest completions. Writes the same as JSON lines to
`--out` when given. It is the evidence behind docs/results/README.md's section on node collapses.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

from pubswap_flwr.config import ExperimentConfig, parse_overrides
from pubswap_flwr.evaluation import evaluate
from pubswap_flwr.node_runtime.learner import Learner, NodeSettings, WorkReport
from pubswap_flwr.node_runtime.state import NodeIdentity
from pubswap_flwr.settings import EvalSettings
from pubswap_flwr.tasks.verifiers import completion_shape


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="config key=value pairs")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--node", type=int, default=0, help="node index (its task mix and seeds)")
    parser.add_argument("--eval-items", type=int, default=30, help="held-out items per task")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    flat = {"run-name": "probe", "eval.items-per-task": args.eval_items, **parse_overrides(args.overrides)}
    cfg = ExperimentConfig.from_flat(flat)
    with tempfile.TemporaryDirectory() as state:
        learner = Learner(NodeSettings.of(cfg), NodeIdentity(args.node, Path(state), cfg.model.name))
        items = learner.universe.held_out.items
        print(f"node {args.node} tasks {learner.task_names}; lr {cfg.train.learning_rate}; "
              f"{len(items)} held-out items", flush=True)
        out = args.out.open("w") if args.out else None
        started = time.perf_counter()
        for step in range(1, args.steps + 1):
            batch = learner.stream.take(cfg.train.prompts_per_step, learner.state.cursor)
            groups, sample_s = learner.rollout(batch, cfg.train.completions_per_prompt)
            learner.learn_step(groups, "private", WorkReport(), sample_s)
            if step % args.every and step != 1:
                continue
            rewards = [r for g in groups for r in g.rewards]
            texts = [c.text for g in groups for c in g.completions]
            shapes = collections.Counter(completion_shape(t) for t in texts)
            held = evaluate(learner.policy, items,
                            EvalSettings(samples=2, seed=step, max_chars=cfg.generation.max_completion_chars))
            row = {
                "step": step,
                "seconds": round(time.perf_counter() - started, 1),
                "train_reward": sum(rewards) / len(rewards),
                "train_correct": sum(r >= 1.0 for r in rewards) / len(rewards),
                "train_partial": sum(0.0 < r < 1.0 for r in rewards) / len(rewards),
                "shapes": {k: v / len(texts) for k, v in shapes.items()},
                "heldout_sampled": held["sampled_accuracy"],
                "heldout_greedy": held["greedy_accuracy"],
                "heldout_sampled_reward": held["sampled_reward"],
                "common": collections.Counter(texts).most_common(3),
            }
            print(f"step {step:4d} reward {row['train_reward']:.3f} correct {row['train_correct']:.3f} "
                  f"partial {row['train_partial']:.3f} | held-out sampled {row['heldout_sampled']:.3f} greedy "
                  f"{row['heldout_greedy']:.3f} reward {row['heldout_sampled_reward']:.3f} | "
                  + " ".join(f"{k} {v:.2f}" for k, v in sorted(row["shapes"].items()))
                  + f" | {row['common'][0][0]!r} x{row['common'][0][1]}", flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
        if out:
            out.close()


if __name__ == "__main__":
    main()
