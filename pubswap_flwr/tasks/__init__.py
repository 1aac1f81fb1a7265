"""Tasks: reasoning-gym specs and mixtures, organization data files, disjoint splits, prompts and verifiers."""

from .budget import BUDGET_EXHAUSTED_REASON, ScoringBudget, SenderUsage
from .files import load_items
from .items import TaskItem
from .prompts import PromptFormatter, user_message
from .specs import DEFAULT_MIX, PRESETS, TaskError, TaskSpec, parse_custom_tasks, parse_mix
from .splits import HeldOutSet, ItemListStream, MixtureStream, PublicSet, StreamCursor, node_mixes
from .verifiers import (
    Score,
    extract_answer,
    is_correct,
    lenient_answer,
    lenient_score,
    score_completion,
    training_reward,
)
from .workers import ScoringTimeout

# isort: split
from . import adapters, choice, math_answers  # noqa: F401,E402 - registers the math/mc verifiers and dataset formats

__all__ = [
    "BUDGET_EXHAUSTED_REASON",
    "DEFAULT_MIX",
    "HeldOutSet",
    "ItemListStream",
    "MixtureStream",
    "PRESETS",
    "PromptFormatter",
    "PublicSet",
    "Score",
    "ScoringBudget",
    "ScoringTimeout",
    "SenderUsage",
    "StreamCursor",
    "TaskError",
    "TaskItem",
    "TaskSpec",
    "extract_answer",
    "is_correct",
    "load_items",
    "node_mixes",
    "parse_custom_tasks",
    "parse_mix",
    "score_completion",
    "lenient_answer",
    "lenient_score",
    "training_reward",
    "user_message",
]
