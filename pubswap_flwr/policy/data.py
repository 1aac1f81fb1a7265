"""Where the project's data/ folder (its embedded models and their build files) is, wherever Flower runs the app
from, and transformers' logging kept quiet; below model.py and packaged.py, which both need them."""

from __future__ import annotations

import json
import os
import warnings
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

DATA_DIR_ENV = "PUBSWAP_DATA_DIR"


class ModelError(ValueError):
    """A model name cannot be resolved or loaded."""


def _editable_source_dir() -> Path | None:
    """The checkout an editable `pip install -e .` points at (the FAB copy that Flower runs has no data/)."""
    try:
        dist = metadata.distribution("pubswap-flwr")
    except metadata.PackageNotFoundError:
        return None
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    url = json.loads(text).get("url", "")
    if not url.startswith("file://"):
        return None
    return Path(unquote(urlparse(url).path))


def data_dir() -> Path:
    """The project's data/ folder, wherever Flower runs the app from (it never changes directory)."""
    candidates = []
    if os.environ.get(DATA_DIR_ENV):
        candidates.append(Path(os.environ[DATA_DIR_ENV]).expanduser())
    candidates.append(Path(__file__).resolve().parents[2] / "data")
    source = _editable_source_dir()
    if source is not None:
        candidates.append(source / "data")
    for candidate in candidates:
        # Flower's app bundle copies data/*.json but never weights, so a data/ without weights is not the one.
        if any((candidate / "models").glob("*/model.safetensors")):
            return candidate.resolve()
    raise ModelError(
        "cannot find the project's data/ folder (looked in: " + ", ".join(str(c) for c in candidates) + "); "
        f"install the project with `pip install -e .` or set {DATA_DIR_ENV}"
    )


def quiet_transformers() -> None:
    """No per-load progress bars or rename FutureWarnings in run logs (they repeat for every simulated client)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*deprecated.*", category=FutureWarning)
