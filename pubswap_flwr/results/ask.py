"""`pubswap ask RUN "question"`: one question to a run's trained adapter, answered as in training.

The adapter (the run's final global adapter, a SAPO node's with --node, or --adapter DIR) is loaded on the base model
the run's config names, resolved offline as `pubswap verify` resolves it (embedded and packaged names, local folders
outside the run directory; never a download, never weights or code the run directory ships); the question becomes the
prompt training used (the chat template and tasks.template's instruction to answer inside <answer> tags) and is
answered by the training sampler: greedy by default, or --samples N at the run's (or --temperature's) temperature.
Torch threads are sized as training sizes them (model.threads). Prints each completion and the answer extracted from
its tags.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from ..untrusted import one_line
from .verify_inputs import VerifyError, adapter_base, adapter_folder, read_config, read_weights

ASK_UID = "ask/0"


@dataclass(frozen=True)
class Answer:
    completion: str
    answer: str | None  # the text inside the last <answer> tags, None without them


def question_item(question: str, family: str = "plain"):
    """The question as a task item the prompt formatter renders (no reference answer: nothing is scored)."""
    from ..tasks import TaskItem

    return TaskItem(uid=ASK_UID, task="ask", question=question, answer=None, verifier="exact", family=family)


def find_adapter(run_dir: Path, adapter: Path | None, node: int | None) -> tuple[Path, Path]:
    """(adapter folder, the folder its files are read under): --adapter DIR, a SAPO node's, or the run's final one."""
    if adapter is not None:
        if not adapter_folder(adapter, adapter):
            raise VerifyError(f"{adapter} holds no adapter (no adapter_config.json)")
        return adapter, adapter
    if node is not None:
        folder = run_dir / "nodes" / f"partition-{node}" / "adapter"
        if not adapter_folder(folder, run_dir):
            raise VerifyError(f"{run_dir} has no adapter for node {node} ({folder})")
        return folder, run_dir
    from .verify import final_adapters

    label, folder = final_adapters(run_dir)[0]
    if label != "global":
        raise VerifyError(f"{run_dir} keeps one adapter per node (sapo, local): choose one with --node N")
    return folder, run_dir


# parameters: `pubswap ask`'s options, keyword-only with their defaults
def ask(run_dir: Path, question: str, *, adapter: Path | None = None, node: int | None = None, samples: int = 0,
        temperature: float | None = None, max_new_tokens: int | None = None, family: str = "plain",
        seed: int = 0) -> tuple[str, list[Answer]]:
    """(the prompt, the answers): one greedy answer when `samples` is 0, else `samples` sampled ones."""
    import torch

    from ..policy import Policy
    from ..policy.model import ModelError
    from ..policy.threads import apply_threads
    from ..shared import policy_spec
    from ..tasks import extract_answer

    if samples < 0:
        raise VerifyError(f"--samples must be >= 0, got {samples}")
    cfg = read_config(run_dir)
    overrides = {**({"generation.temperature": temperature} if temperature is not None else {}),
                 **({"generation.max-new-tokens": max_new_tokens} if max_new_tokens is not None else {})}
    if overrides:
        from ..config import ConfigError

        try:
            cfg = cfg.with_overrides(overrides)
        except ConfigError as err:
            raise VerifyError(str(err)) from None
    folder, root = find_adapter(run_dir, adapter, node)
    base = adapter_base(folder, cfg, root)
    weights = read_weights(folder, root)
    apply_threads(cfg.model.threads)
    try:
        policy = Policy(policy_spec(cfg, model_name=base))
    except (ModelError, OSError) as err:
        raise VerifyError(f"base model {base!r} cannot be loaded: {str(err)[:300]}") from None
    try:
        policy.load_adapter(weights)
    except ValueError as err:
        raise VerifyError(f"{folder / 'adapter_model.safetensors'}: {str(err)[:300]}") from None
    item = question_item(question, family)
    torch.manual_seed(seed)
    rows = policy.sample([item], max(1, samples), greedy=samples == 0, with_logprobs=False)
    return policy.prompts([item])[0], [Answer(s.text, extract_answer(s.text)) for s in rows[0]]


def render(answers: list[Answer]) -> str:
    lines = []
    for number, found in enumerate(answers, 1):
        head = f"[{number}] " if len(answers) > 1 else ""
        shown = found.answer if found.answer is not None else "(no <answer> tags)"
        lines += [f"{head}completion: {found.completion}", f"{head}answer: {shown}"]
    return "\n".join(lines)


def cmd_ask(args: argparse.Namespace) -> int:
    if args.greedy and args.samples:
        print("pubswap ask: --greedy and --samples exclude each other", file=sys.stderr)
        return 2
    try:
        prompt, answers = ask(Path(args.run), args.question, adapter=Path(args.adapter) if args.adapter else None,
                              node=args.node, samples=args.samples, temperature=args.temperature,
                              max_new_tokens=args.max_new_tokens, family=args.family, seed=args.seed)
    except VerifyError as err:
        print(f"pubswap ask: {one_line(err)}", file=sys.stderr)
        return 2
    if args.show_prompt:
        print(f"prompt: {prompt}")
    print(render(answers))
    return 0


def register(sub) -> None:
    parser = sub.add_parser("ask", help="ask a run's trained adapter one question, prompted as in training")
    parser.add_argument("run", help="a run directory (its config.json names the base model and the prompt format)")
    parser.add_argument("question")
    parser.add_argument("--adapter", metavar="DIR", help="this adapter folder instead of the run's final adapter")
    parser.add_argument("--node", type=int,
                        help="a sapo or local run: this node's own adapter (nodes/partition-N/adapter)")
    parser.add_argument("--greedy", action="store_true", help="one greedy answer (the default)")
    parser.add_argument("--samples", type=int, default=0, help="N sampled answers at the temperature instead")
    parser.add_argument("--temperature", type=float, help="sampling temperature (default: the run's)")
    parser.add_argument("--max-new-tokens", type=int, help="default: the run's generation.max-new-tokens")
    parser.add_argument("--family", default="plain", choices=("plain", "math", "mc"),
                        help="the instruction training used for this kind of question (with tasks.template auto)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for sampled answers")
    parser.add_argument("--show-prompt", action="store_true", help="also print the prompt the model got")
    parser.set_defaults(func=cmd_ask)
