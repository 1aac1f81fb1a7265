"""Benchmark: scoring time per completion under the scoring time limit: worst case and median per verifier on an
adversarial corpus, and the overhead of the budgeted scorer over the old direct call on ordinary completions.

    python benchmarks/scoring.py [--timeout 2] [--repeat 7]

The adversarial corpus holds the answers that hung scorers (`9**9**9` for the sympy-based reasoning-gym scorers, a
large product for intermediate_integration, `"A B " * 14 + "!"` for multiple choice, a tower of powers for math) and
other long or repetitive texts. Goals: no completion takes longer than its limit plus the grace (--timeout + 1 s);
ordinary completions cost at most about 1.25 x the old direct call (median) where the scorer runs in the caller,
and about 1.3 x where it runs in the worker (one pipe round trip over 0.5-8 ms of sympy work). The old direct call
is the scorer called in-process as `score_completion` did before time limits (regex answer extraction, no worker);
it is timed only on ordinary completions, on which it cannot hang, interleaved with the budgeted call.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

from pubswap_flwr.tasks import TaskItem, score_completion
from pubswap_flwr.tasks.isolation import IsolatedScorer, set_default_isolated_scorer
from pubswap_flwr.tasks.math_answers import MathChecker, set_default_checker
from pubswap_flwr.tasks.reasoning_gym_scoring import scored_in_worker
from pubswap_flwr.tasks.specs import PRESETS, TaskSpec
from pubswap_flwr.tasks.splits import rg_item
from pubswap_flwr.tasks.verifiers import VERIFIERS, Score

OLD_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
GRACE_S = 1.0
MC_QUESTION = "Which organ makes insulin?\nA. Liver\nB. Pancreas\nC. Spleen\nD. Kidney"
SYMPY = ["countdown", "puzzle24", "polynomial_multiplication", "simple_integration", "intermediate_integration"]


def rg(generator: str, index: int = 0) -> TaskItem:
    return rg_item("bench", TaskSpec(generator, generator, {}), 4321, index, f"bench/{generator}/{index}")


def label(item: TaskItem) -> str:
    name = f"rg:{item.provenance['generator']}" if item.verifier == "rg" else item.verifier
    return f"{name} ({'worker' if scored_in_worker(item) else 'math worker' if item.verifier == 'math' else 'caller'})"


def tagged(answer: str) -> str:
    return f"Let me think.\n<answer>{answer}</answer>"


def old_direct(completion: str, item: TaskItem, max_chars: int) -> Score:
    """score_completion as it was before time limits: regex extraction, the scorer called in this process."""
    if len(completion) > max_chars:
        return Score(0.0, "too long")
    matches = OLD_ANSWER_RE.findall(completion)
    if not matches:
        return Score(0.0, "no tag")
    try:
        return Score(min(1.0, max(0.0, float(VERIFIERS[item.verifier](matches[-1].strip(), item)))))
    except Exception as err:  # noqa: BLE001 - the old score_completion's catch, reproduced for the comparison
        return Score(0.0, f"scorer error: {type(err).__name__}: {err}")


def adversarial_corpus() -> list[tuple[TaskItem, str, int]]:
    """(item, completion, max_chars)."""
    big_product = "*".join(f"sin(x**{i}+{i})" for i in range(1, 60))
    corpus: list[tuple[TaskItem, str, int]] = []
    for generator in SYMPY:
        item = rg(generator)
        for answer in ["9**9**9", "9**" * 300 + "9", "(x+1)**300*sin(x)**77*atan(x)**33", big_product,
                       "(" * 900 + "x" + ")" * 900, "+".join(["x"] * 900), "99999999**99999999"]:
            corpus.append((item, tagged(answer), 4096))
    mc = TaskItem("bench/mc/0", "mc", MC_QUESTION, "B", "mc")
    mc_peer_question = TaskItem("bench/mc/1", "mc", "A. x" + " " * 200_000 + "y\nB. z", "B", "mc")
    for answer in ["A B " * 14 + "!", "A B " * 500 + "!", "A) " * 650 + "!", "(A), " * 400 + "!",
                   "answer" + " " * 1900 + "x", "A or " * 400 + "!", "B. " + "or C " * 390]:
        corpus.append((mc, tagged(answer), 4096))
    corpus.append((mc_peer_question, tagged("B"), 4096))
    math = TaskItem("bench/math/0", "math", "q", "\\frac{1}{2}", "math", family="math")
    for answer in ["9^{9^{9}}", "\\frac{" * 600, "2^{2^{2^{2^{2^{2^{2}}}}}}", "\\sqrt{" * 300 + "2" + "}" * 300,
                   "10^{10^{10}}!", "x" * 1900]:
        corpus.append((math, tagged(answer), 4096))
    exact = TaskItem("bench/exact/0", "exact", "q", "Paris", "exact")
    numeric = TaskItem("bench/numeric/0", "numeric", "q", "2.5", "numeric")
    corpus.append((exact, "<answer>" * 25_000 + "Paris</answer>", 250_000))
    corpus.append((exact, tagged("Paris " * 600), 4096))
    corpus.append((numeric, tagged("1" * 4000 + "x"), 4096))
    corpus.append((numeric, tagged("1e999999999"), 4096))
    for generator, answer in [("gcd", "9" * 4000), ("spell_backward", "a" * 4000),
                              ("fraction_simplification", "\\frac{" + " " * 3000 + "1}{2}"),
                              ("basic_arithmetic", "-" * 4000), ("number_sorting", "[" * 2000 + "]" * 2000),
                              ("leg_counting", "9" * 4000), ("word_sorting", "a, " * 1300)]:
        corpus.append((rg(generator), tagged(answer), 4096))
    return corpus


def ordinary_corpus() -> list[tuple[TaskItem, str, int]]:
    corpus: list[tuple[TaskItem, str, int]] = []
    for name in list(PRESETS) + SYMPY:
        for index in range(4):
            item = rg_item("bench", PRESETS.get(name, TaskSpec(name, name, {})), 4321, index, f"bench/{name}/{index}")
            corpus.append((item, tagged(item.answer), 4096))
            corpus.append((item, tagged("7"), 4096))
    mc = TaskItem("bench/mc/0", "mc", MC_QUESTION, "B", "mc")
    for answer in ["B", "(B)", "The answer is B", "Pancreas", "B or C", "A. Liver"]:
        corpus.append((mc, tagged(answer), 4096))
    for answer in ["Paris", "paris", "London"]:
        corpus.append((TaskItem("bench/exact/0", "exact", "q", "Paris", "exact"), tagged(answer), 4096))
    for answer in ["2.5", "5/2", "3"]:
        corpus.append((TaskItem("bench/numeric/0", "numeric", "q", "2.5", "numeric"), tagged(answer), 4096))
    for gold, answer in [("\\frac{1}{2}", "0.5"), ("3", "4"), ("\\sqrt{8}", "2\\sqrt{2}"), ("x^2", "x^2")]:
        corpus.append((TaskItem("bench/math/0", "math", "q", gold, "math", family="math"), tagged(answer), 4096))
    return corpus


def clock(fn) -> tuple[object, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per completion (timeout_s)")
    parser.add_argument("--repeat", type=int, default=7, help="timings per ordinary completion and method")
    args = parser.parse_args()
    isolated = IsolatedScorer(grace_s=GRACE_S)
    checker = MathChecker(timeout_s=args.timeout, grace_s=GRACE_S)
    set_default_isolated_scorer(isolated)
    set_default_checker(checker)
    score_completion(tagged("1"), TaskItem("w", "math", "q", "2", "math"))  # start the math worker
    score_completion(tagged("3+4"), rg("countdown"))  # load the dataset here and in the worker
    isolated.close()
    _, startup = clock(lambda: score_completion(tagged("3+4"), rg("countdown")))
    print(f"worker start (imports, paid once per process and after a kill; not charged to a completion): "
          f"{startup:.2f} s")

    print(f"\nadversarial corpus, timeout_s={args.timeout:g}, grace {GRACE_S:g} s "
          f"(goal: every completion under {args.timeout + GRACE_S:g} s)")
    rows: dict[str, list[tuple[float, Score]]] = {}
    for item, completion, max_chars in adversarial_corpus():
        score, seconds = clock(lambda: score_completion(completion, item, max_chars=max_chars,
                                                         timeout_s=args.timeout))
        rows.setdefault(label(item), []).append((seconds, score))
    print(f"  {'verifier':38s} {'n':>3s} {'median s':>9s} {'worst s':>8s} {'timeouts':>8s}")
    worst_all = 0.0
    for name, results in rows.items():
        times = [seconds for seconds, _ in results]
        worst_all = max(worst_all, max(times))
        print(f"  {name:38s} {len(times):3d} {statistics.median(times):9.4f} {max(times):8.3f} "
              f"{sum(score.timed_out for _, score in results):8d}")
    print(f"  worst case over the corpus: {worst_all:.3f} s per completion; isolated-worker restarts: "
          f"{isolated.restarts}, math-worker restarts: {checker.restarts}")

    print(f"\nordinary completions: budgeted score_completion vs the old direct call, median of {args.repeat} "
          "interleaved timings each (math: cache off, so every check is a round trip to its worker)")
    checker.cache_size = 0
    corpus = ordinary_corpus()
    groups: dict[str, list[tuple[float, float]]] = {}
    mismatches = []
    for item, completion, max_chars in corpus:  # warm every dataset and cache in both paths first
        old, new = old_direct(completion, item, max_chars), score_completion(completion, item, max_chars=max_chars)
        if old.reward != new.reward:
            mismatches.append((label(item), completion[-60:], old, new))
    for item, completion, max_chars in corpus:
        olds, news = [], []
        for _ in range(args.repeat):
            olds.append(clock(lambda: old_direct(completion, item, max_chars))[1])
            news.append(clock(lambda: score_completion(completion, item, max_chars=max_chars,
                                                       timeout_s=args.timeout))[1])
        groups.setdefault(label(item), []).append((statistics.median(olds), statistics.median(news)))
    print(f"  {'verifier':38s} {'n':>3s} {'old ms':>8s} {'new ms':>8s} {'ratio':>6s}")
    for place in ("caller", "worker", "math worker"):
        olds_all, news_all = [], []
        for name, pairs in groups.items():
            if not name.endswith(f"({place})"):
                continue
            old = statistics.median(o for o, _ in pairs)
            new = statistics.median(n for _, n in pairs)
            olds_all += [o for o, _ in pairs]
            news_all += [n for _, n in pairs]
            print(f"  {name:38s} {len(pairs):3d} {old * 1e3:8.4f} {new * 1e3:8.4f} {new / old:6.2f}")
        if olds_all:
            old, new = statistics.median(olds_all), statistics.median(news_all)
            print(f"  {'= all scored in the ' + place:38s} {len(olds_all):3d} {old * 1e3:8.4f} {new * 1e3:8.4f} "
                  f"{new / old:6.2f}   (sum of medians ratio {sum(news_all) / sum(olds_all):.2f})")
    gcd = rg("gcd")
    inline = statistics.median(clock(lambda: VERIFIERS["rg"](gcd.answer, gcd))[1] for _ in range(200))
    remote = statistics.median(clock(lambda: isolated.score(gcd.answer, gcd, args.timeout))[1] for _ in range(200))
    print(f"  a cheap scorer (gcd) in the caller {inline * 1e3:.4f} ms vs sent to the worker {remote * 1e3:.4f} ms: "
          f"{remote / inline:.0f} x (why cheap scorers stay in the caller)")
    print(f"  rewards that differ between the two: {len(mismatches)}")
    for mismatch in mismatches:
        print("   ", mismatch)
    isolated.close()
    checker.close()


if __name__ == "__main__":
    main()
