"""reasoning-gym items scored by the dataset instance that generated them, and safe re-implementations of the
generators whose stock `score_answer` calls eval() or sympy on model or entry text; which generators are scored in
the caller and which in the isolated worker (isolation.py)."""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Callable

from .items import TaskItem
from .specs import generator_dataset

MAX_LITERAL_CHARS = 20_000


def _literal(text: str) -> Any:
    if len(text) > MAX_LITERAL_CHARS:
        raise ValueError("literal too long")
    return ast.literal_eval(text)


def _safe_binary_matrix(dataset, answer: str, entry: dict) -> float:
    oracle = entry["answer"]
    if answer == oracle:
        return 1.0
    try:
        return 0.1 if dataset._matrix_to_str(_literal(answer)) == oracle else 0.0
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return 0.0


def _safe_spiral_matrix(dataset, answer: str, entry: dict) -> float:
    oracle = entry["answer"].strip()
    answer = answer.strip()
    if not answer:
        return 0.0
    if answer == oracle:
        return 1.0
    try:
        return 0.1 if " ".join(str(x) for x in _literal(answer)) == oracle else 0.0
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return 0.0


def _safe_string_insertion(dataset, answer: str, entry: dict) -> float:
    oracle = entry["answer"]
    if answer == oracle:
        return 1.0
    try:
        return 0.1 if "".join(_literal(answer)) == oracle else 0.0
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return 0.0


def _safe_n_queens(dataset, answer: str, entry: dict) -> float:
    valid = entry["metadata"]["valid_answers"]
    if answer in valid:
        return 1.0
    try:
        return 0.5 if dataset._board_to_string(_literal(answer)) in valid else 0.0
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, IndexError, AttributeError):
        return 0.0


def _safe_number_sorting(dataset, answer: str, entry: dict) -> float:
    # The stock scorer falls back to eval() on entry["answer"] when it is not JSON (and reasoning-gym writes it as a
    # Python list literal, "['-5.19', '19.0']"); peers control entries in SAPO. Parse it as a literal instead and
    # give the stock scorer JSON.
    reference = entry["answer"]
    try:
        expected = json.loads(reference)
    except (json.JSONDecodeError, TypeError):
        try:
            expected = _literal(reference)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as err:
            raise ValueError("reference answer is not a list literal") from err
    if not isinstance(expected, list):
        raise ValueError("reference answer is not a list")
    return float(dataset.score_answer(answer, {**entry, "answer": json.dumps(expected)}))


_INT_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
            ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b}
MAX_INT_BITS = 1 << 16
MAX_SHIFT = 64


def _int_expression(text: str) -> int:
    """Value of an integer expression of literals, + - * << >> and unary minus (what bitwise_arithmetic generates);
    ValueError for anything else. Never evaluates text as code."""
    if len(text) > MAX_LITERAL_CHARS:
        raise ValueError("expression too long")

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = value(node.operand)
            return -inner if isinstance(node.op, ast.USub) else inner
        if isinstance(node, ast.BinOp) and type(node.op) in _INT_OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, (ast.LShift, ast.RShift)) and not 0 <= right <= MAX_SHIFT:
                raise ValueError(f"shift by {right} is out of range")
            result = _INT_OPS[type(node.op)](left, right)
            if result.bit_length() > MAX_INT_BITS:
                raise ValueError("intermediate value too large")
            return result
        raise ValueError(f"not an integer expression: {type(node).__name__}")

    try:
        return value(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, RecursionError, MemoryError) as err:
        raise ValueError(f"not an integer expression: {type(err).__name__}") from err


def _safe_bitwise_arithmetic(dataset, answer: str, entry: dict) -> float:
    # The stock scorer eval()s entry["metadata"]["problem"]; peers control entries in SAPO.
    problem = (entry.get("metadata") or {}).get("problem")
    if not isinstance(problem, str):
        raise ValueError("bitwise_arithmetic item has no metadata.problem text")
    expected = _int_expression(problem)
    try:
        return 1.0 if int(str(answer), 0) == expected else 0.0
    except ValueError:
        return 0.0


# sympy.parse_expr eval()s its (transformed) input, so it runs code given e.g. `__import__("os").system(...)`.
# Text reaching it must be a plain math expression: letters, digits, whitespace, + - * / ^ ( ) , and decimal points,
# no attribute access, and every name a single letter or a common math function (no strings, no underscores).
MAX_EXPRESSION_CHARS = 2000
_PLAIN_MATH_RE = re.compile(r"[0-9A-Za-z\s+\-*/^().,]*")
_ATTRIBUTE_RE = re.compile(r"\.\s*[A-Za-z]")
_MATH_NAMES = frozenset(
    "sin cos tan cot sec csc asin acos atan acot sinh cosh tanh asinh acosh atanh exp log ln sqrt pi oo Abs "
    "Integral".split()
)


def is_plain_math(text: Any) -> bool:
    return (isinstance(text, str) and len(text) <= MAX_EXPRESSION_CHARS and _PLAIN_MATH_RE.fullmatch(text) is not None
            and _ATTRIBUTE_RE.search(text) is None
            and all(len(name) == 1 or name in _MATH_NAMES for name in re.findall(r"[A-Za-z]+", text)))


def _sympy_guarded(*reference_fields: str) -> Callable[[Any, str, dict], float]:
    """A scorer that checks the answer and the entry fields the stock scorer parses (`answer`, `metadata.<key>`)
    before the stock scorer sees them: a bad reference raises ValueError (forged entry), a bad answer is scored as
    no answer."""

    def score(dataset, answer: str, entry: dict) -> float:
        for name in reference_fields:
            section, _, key = name.partition(".")
            text = entry.get(section) if not key else (entry.get(section) or {}).get(key)
            if not is_plain_math(text):
                raise ValueError(f"reference {name} is not a plain math expression")
        if not is_plain_math(answer):
            return float(dataset.score_answer(None, entry))
        return float(dataset.score_answer(answer, entry))

    return score


# Generators whose stock score_answer calls eval() or sympy.parse_expr, directly or through a helper (reasoning-gym
# 0.1.25; tests/unit/test_verifiers.py re-scans the installed package so a new one is caught).
SAFE_RG_SCORERS: dict[str, Callable[[Any, str, dict], float]] = {
    "binary_matrix": _safe_binary_matrix,
    "spiral_matrix": _safe_spiral_matrix,
    "string_insertion": _safe_string_insertion,
    "n_queens": _safe_n_queens,
    "number_sorting": _safe_number_sorting,
    "bitwise_arithmetic": _safe_bitwise_arithmetic,
    "countdown": _sympy_guarded(),
    "puzzle24": _sympy_guarded(),
    "polynomial_multiplication": _sympy_guarded("answer"),
    "simple_integration": _sympy_guarded("metadata.integrand"),
    "intermediate_integration": _sympy_guarded("metadata.integrand"),
}


# Generators scored in the caller's process: their scoring was read and is cheap, linear-time Python on the answer
# (string compare, Decimal/int/float parsing, one anchored regex, ast.literal_eval of bounded text). Every other
# generator, the sympy-based ones first, is scored in the isolated worker (isolation.py).
INLINE_RG_GENERATORS = frozenset({
    "basic_arithmetic", "gcd", "count_bits", "fraction_simplification", "spell_backward", "chain_sum",
    "base_conversion", "products",  # the preset tasks (specs.PRESETS)
    "binary_matrix", "spiral_matrix", "string_insertion", "n_queens", "number_sorting", "bitwise_arithmetic",
})


def scored_in_worker(item: TaskItem) -> bool:
    """Whether `score_completion` runs `item`'s scorer in the isolated worker: reasoning-gym items of a generator not
    in INLINE_RG_GENERATORS. (An item without a generator is scored in the caller: it fails at once.)"""
    if item.verifier != "rg":
        return False
    generator = item.provenance.get("generator")
    return isinstance(generator, str) and bool(generator) and generator not in INLINE_RG_GENERATORS


def score_reasoning_gym(answer: str, item: TaskItem) -> float:
    """The reward of an rg item from the dataset instance its provenance names; a generator in SAFE_RG_SCORERS
    is scored by its safe re-implementation."""
    prov = item.provenance
    generator = prov.get("generator")
    if not generator:
        raise ValueError("reasoning-gym item has no provenance.generator")
    dataset = generator_dataset(generator, prov.get("config") or {}, int(prov.get("seed", 0)))
    entry = {"question": item.question, "answer": item.answer, "metadata": item.metadata}
    safe = SAFE_RG_SCORERS.get(generator)
    if safe is not None:
        return float(safe(dataset, answer, entry))
    return float(dataset.score_answer(answer, entry))
