"""What `pubswap verify` reads from a run directory, checked: its config, metrics, adapters and base model."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import site
import sys
import sysconfig
from importlib.machinery import PathFinder
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..adapter_files import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from ..schema import parse_value_of
from ..server.metrics import CONFIG_FILE, METRICS_FILE, MetricsError, RunConfigFile, parse_metrics
from ..untrusted import UntrustedFileError, check_no_links, is_present, read_bytes, read_json, read_text

if TYPE_CHECKING:
    from ..tasks.rewards import RewardRef

MAX_PROMPT_CHARS = 1 << 20  # a rendered prompt longer than this is a template's doing, not a question's
REWARD_SOURCES = ("verify imports a run's rewards only from reward modules in the app's folder ({root}) or a "
                  "PYTHONPATH folder, never from Python's library, installed packages or the run directory")


class VerifyError(ValueError):
    """The run cannot be verified; the message says what is missing or wrong, naming the file."""


def read_config(run_dir: Path):
    """The run's ExperimentConfig from its config.json."""
    from ..config import ConfigError, ExperimentConfig

    path = run_dir / CONFIG_FILE
    if not is_present(path):
        raise VerifyError(f"{run_dir} has no {CONFIG_FILE}: not a run directory")
    data = parse_value_of(path, _json(path, run_dir), RunConfigFile, VerifyError)
    if not data.config:
        raise VerifyError(f"{path}: holds no run-config keys ('config')")
    try:
        return ExperimentConfig.from_flat(data.config)
    except (ConfigError, TypeError) as err:
        raise VerifyError(f"{path}: {err}") from None


def read_rows(run_dir: Path) -> list[dict]:
    path = run_dir / METRICS_FILE
    try:
        return parse_metrics(read_text(path, run_dir), path)
    except (UntrustedFileError, MetricsError) as err:
        raise VerifyError(str(err)) from None


def _json(path: Path, root: Path) -> Any:
    try:
        return read_json(path, root)
    except UntrustedFileError as err:
        raise VerifyError(str(err)) from None


def adapter_folder(folder: Path, run_dir: Path) -> bool:
    """Whether `folder` holds an adapter (its adapter_config.json is there); a link on the way or a config that is
    not a regular file is refused, not skipped."""
    try:
        check_no_links(folder, run_dir)
    except UntrustedFileError as err:
        raise VerifyError(str(err)) from None
    if not is_present(folder / ADAPTER_CONFIG):
        return False
    _json(folder / ADAPTER_CONFIG, run_dir)  # a FIFO or device is refused here, before anything opens it
    return True


def _same_model(named: str, base: str) -> bool:
    if named == base:
        return True
    from ..policy.model import EMBEDDED_PREFIX
    from ..policy.packaged import is_packaged

    if is_packaged(named) or named.startswith(EMBEDDED_PREFIX):
        return False
    # adapter_config.json records a local folder as its absolute path (export.base_reference)
    return Path(named).expanduser().resolve() == Path(base).expanduser().resolve()


def adapter_base(folder: Path, cfg, run_dir: Path) -> str:
    """The base model of the adapter in `folder`, as the run's config names it: an adapter_config.json naming
    another model is refused, as is a model verify would have to download or that the run ships itself."""
    path = folder / ADAPTER_CONFIG
    config = _json(path, run_dir)
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str):
        raise VerifyError(f"{path}: base_model_name_or_path must name the base model as text, got "
                          f"{str(base)[:60]!r}")
    named = cfg.model.named
    match = next((n for n in named if _same_model(n, base)), None)
    if match is None:
        raise VerifyError(f"{path}: base model {base[:200]!r} is none the run's {CONFIG_FILE} names "
                          f"({', '.join(map(repr, named))}); verify runs no other")
    check_offline(match, run_dir)
    return match


def check_offline(name: str, run_dir: Path) -> None:
    """An embedded or packaged model, or a local folder outside the run directory: verify never downloads a hub id
    and never runs weights the run itself ships."""
    from ..policy.model import EMBEDDED_PREFIX
    from ..policy.packaged import is_packaged

    if is_packaged(name) or name.startswith(EMBEDDED_PREFIX):
        return
    local = Path(name).expanduser()
    if not local.is_dir():
        raise VerifyError(f"model {name[:200]!r} (the run's {CONFIG_FILE}) is no embedded or packaged model and no "
                          "folder on this machine: verify is offline and never downloads a hub id")
    if local.resolve().is_relative_to(run_dir.resolve()):
        raise VerifyError(f"model folder {local} lies inside the run directory {run_dir}: verify does not run "
                          "weights a run ships")


def is_local_folder(name: str) -> bool:
    from ..policy.model import EMBEDDED_PREFIX
    from ..policy.packaged import is_packaged

    return not (is_packaged(name) or name.startswith(EMBEDDED_PREFIX))


def read_weights(folder: Path, run_dir: Path) -> dict:
    """The adapter's tensors (torch), from a regular file."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    path = folder / ADAPTER_WEIGHTS
    try:
        return load(read_bytes(path, run_dir))
    except UntrustedFileError as err:
        raise VerifyError(str(err)) from None
    except SafetensorError as err:
        raise VerifyError(f"{path}: not a readable safetensors file ({str(err)[:200]})") from None


def _render_all(location: str, items: Sequence, template: str, max_chars: int, conn) -> None:
    """In the child: load the tokenizer, say so, then render every prompt; reply "" or what was wrong."""
    from jinja2 import TemplateError

    from ..policy.model import ModelError, load_tokenizer
    from ..tasks import PromptFormatter

    try:
        tokenizer = load_tokenizer(location)
        conn.send("loaded")
        formatter = PromptFormatter(tokenizer, template)
        for item in items:
            if len(formatter(item)) > max_chars:
                conn.send(f"renders a prompt of over {max_chars} characters")
                return
    except (ModelError, OSError, ValueError, TypeError, TemplateError) as err:
        conn.send(f"cannot be used ({type(err).__name__}: {str(err)[:200]})")
        return
    conn.send("")


def check_chat_template(location: str, items: Sequence, template: str, seconds: float,
                        load_seconds: float = 300.0) -> None:
    """Render every prompt the evaluation will render (the same tokenizer, formatter and items) in a child process
    that is killed after `seconds` (jinja runs a template's loops in Python and C, where no timer in this process
    could stop them); VerifyError when it takes longer or renders an oversized prompt."""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of this process's threads
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_render_all, args=(location, list(items), template, MAX_PROMPT_CHARS, send),
                            daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(load_seconds):
            raise VerifyError(f"the tokenizer of {location} did not load within {load_seconds:g} s")
        problem = receive.recv()
        if problem == "loaded" and not receive.poll(seconds):
            raise VerifyError(f"the chat template of {location} did not render the prompts within {seconds:g} s")
        if problem == "loaded":
            problem = receive.recv()
    except EOFError:
        raise VerifyError(f"the tokenizer or chat template of {location} cannot be used (its check process "
                          "exited without an answer)") from None
    finally:
        child.kill()
        child.join()
        receive.close()
    if problem:
        raise VerifyError(f"the chat template of {location} {problem}")


def check_reward_source(ref: RewardRef, run_dir: Path) -> None:
    """Refuse a reward `verify --import-rewards` must not import. The run's config.json names it, so only the run's
    own reward modules qualify: those in the app's folder (PACKAGE_ROOT, which holds examples/) or in a folder the
    user put on PYTHONPATH; never a module of Python's standard library or an installed package (`shutil:rmtree`
    called on a model's answer), the app's own package (its functions are no rewards) or code inside the run
    directory. Where the module and each package on its way would be loaded from is looked up without running any
    of them."""
    from ..tasks.rewards import PACKAGE_ROOT

    top = ref.module.partition(".")[0]
    why: str | None
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        why = f"{top!r} is a module of Python's standard library"
    elif top == __name__.partition(".")[0]:
        why = f"{top!r} is the app's own package, not a reward module"
    else:
        why = _source_problem(ref.module, run_dir.resolve(), PACKAGE_ROOT)
    if why:
        raise VerifyError(f"--import-rewards: reward {ref.name!r} refused: {why}; "
                          + REWARD_SOURCES.format(root=PACKAGE_ROOT))


def _source_problem(module: str, run_dir: Path, app_folder: Path) -> str | None:
    """Why `module`'s files are not a run's own reward module, or None when they all are."""
    found = _module_files(module, app_folder)
    if found is None:
        return f"module {module!r} is not found on Python's path or in the app's folder"
    installed = _installed_folders()
    own = [app_folder.resolve()] + [Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                    if p]
    for name, location in found:
        if location is None:
            return f"module {name!r} is built into Python (no file)"
        if location.is_relative_to(run_dir):
            return (f"module {name!r} is found at {location}, inside the run directory {run_dir} (verify never runs "
                    "code a run ships)")
        folder = max((f for f in installed if location.is_relative_to(f)), key=lambda f: len(f.parts), default=None)
        if folder is not None or {"site-packages", "dist-packages"} & set(location.parts):
            return (f"module {name!r} is found at {location}, in Python's library or installed packages"
                    + (f" ({folder})" if folder else ""))
        if not any(location.is_relative_to(root) for root in own):
            return f"module {name!r} is found at {location}, outside the app's folder and PYTHONPATH"
    return None


def _module_files(module: str, app_folder: Path) -> list[tuple[str, Path | None]] | None:
    """[(name, file or folder)] the import of the dotted `module` would load, for it and each package on its way
    (None for one with no file: built in or frozen); None when it is not found. Found as the import system finds
    it, the top level then in the app's folder as tasks.rewards imports it, without running any of it: a package's
    submodules are searched for in its folders, not imported through it."""
    parts = module.split(".")
    found: list[tuple[str, Path | None]] = []
    search: list[str] | None = None  # the top level: sys.meta_path over sys.path
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if search is not None and not search:
            return None  # the module above is no package: it has no submodules
        located = _locate(name, search, app_folder)
        if located is None:
            return None
        origin, search = located
        files = ([Path(origin).resolve()] if origin else []) + [Path(p).resolve() for p in search]
        found += [(name, path) for path in files] or [(name, None)]
    return found


def _locate(name: str, search: list[str] | None, app_folder: Path) -> tuple[str | None, list[str]] | None:
    """(the file, the package's folders) of the module `name` as import would load it, or None when not found."""
    loaded = sys.modules.get(name)
    if loaded is not None:  # import hands back what is already loaded
        return getattr(loaded, "__file__", None), list(getattr(loaded, "__path__", None) or [])
    if search is not None:
        spec = PathFinder.find_spec(name, search)
    else:
        spec = importlib.util.find_spec(name) or PathFinder.find_spec(name, [str(app_folder)])
    if spec is None:
        return None
    return spec.origin if spec.has_location else None, list(spec.submodule_search_locations or [])


def _installed_folders() -> list[Path]:
    """Python's library and the installed packages' folders, of this environment and of the Python it was made from
    (a virtual environment is left out whole)."""
    folders: set[str] = set(site.getsitepackages()) | {site.getusersitepackages()}
    for scheme in (sysconfig.get_paths(), sysconfig.get_paths(vars={"base": sys.base_prefix,
                                                                     "platbase": sys.base_exec_prefix})):
        folders |= {scheme[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in scheme}
    if sys.prefix != sys.base_prefix:
        folders.add(sys.prefix)
    return [Path(folder).resolve() for folder in folders]
