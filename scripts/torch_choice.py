"""Which torch build scripts/setup.sh installs: the pip arguments, printed one per line (stdlib only: it runs before
the venv has anything in it).

    python3 scripts/torch_choice.py            # e.g. "torch==2.13.0" / "--index-url" / "<PyTorch's CPU index>"

PyPI's default torch wheel for Linux is the CUDA build (about 530 MB plus several GB of nvidia runtime packages), which
a machine without a GPU does not need. The choice, first match wins:
1. PUBSWAP_TORCH: "cpu" (PyTorch's CPU-only index), "default" (pip's own indexes: on PyPI the CUDA build), or any
   other value is taken as the index URL to install torch from;
2. an NVIDIA GPU (nvidia-smi on PATH, or the driver in /proc/driver/nvidia): the CUDA build from pip's own indexes,
   pinned as torch===<version> so that a CPU-only wheel (<version>+cpu) in a local wheel folder is passed over: pip
   would otherwise prefer it, since a local version label sorts above the plain version; a local wheel of a GPU
   build (any label other than +cpu) is taken;
3. a torch wheel of the pinned version in a local wheel folder pip is configured with (PIP_FIND_LINKS or pip's
   find-links setting): pip's own indexes, so an offline machine installs from the folder;
4. otherwise PyTorch's CPU-only index.

    GPU  local wheel  PUBSWAP_TORCH   installs
    -    any          cpu|default|URL what it says
    yes  none/+cpu    unset           torch===<version> (the CUDA build; the +cpu wheel is passed over)
    yes  GPU build    unset           torch==<version> (the local wheel)
    no   any          unset           torch==<version>: the local wheel, else from PyTorch's CPU-only index
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

TORCH_VERSION = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's own index of CPU-only wheels
VARIABLE = "PUBSWAP_TORCH"


def find_links(env: Mapping[str, str], pip_config: Callable[[], str]) -> list[str]:
    """The local wheel folders pip is configured with: PIP_FIND_LINKS, else `pip config list`'s find-links."""
    raw = env.get("PIP_FIND_LINKS", "")
    if not raw:
        for line in pip_config().splitlines():
            key, _, value = line.partition("=")
            if key.strip().endswith("find-links"):
                raw = value.strip().strip("'\"")
                break
    return [part for part in raw.replace(",", " ").split() if part and "://" not in part]


def local_torch_wheel(folders: Sequence[str], version: str = TORCH_VERSION) -> Path | None:
    """A torch wheel of `version` in one of the folders, or None."""
    for folder in folders:
        path = Path(folder)
        if path.is_dir():
            for wheel in sorted(path.glob(f"torch-{version}*.whl")):
                return wheel
    return None


def is_cpu_build(wheel: Path) -> bool:
    """The wheel's local version label says CPU-only (torch-2.13.0+cpu-...)."""
    version = wheel.name.split("-")[1]
    return version.partition("+")[2].startswith("cpu")


def has_nvidia_gpu(which: Callable[[str], str | None] = shutil.which,
                   driver: Path = Path("/proc/driver/nvidia")) -> bool:
    return which("nvidia-smi") is not None or driver.exists()


def choose(env: Mapping[str, str], folders: Sequence[str], gpu: bool) -> tuple[list[str], str]:
    """(pip install arguments, why) for the pinned torch."""
    package = f"torch=={TORCH_VERSION}"
    override = env.get(VARIABLE, "").strip()
    if override == "cpu":
        return [package, "--index-url", CPU_INDEX], f"{VARIABLE}=cpu: the CPU-only build from PyTorch's index"
    if override == "default":
        return [package], f"{VARIABLE}=default: pip's own indexes"
    if override:
        return [package, "--index-url", override], f"{VARIABLE}: torch from {override}"
    wheel = local_torch_wheel(folders)
    if gpu:
        if wheel is not None and not is_cpu_build(wheel):
            return [package], f"an NVIDIA GPU is present and the local wheel {wheel.name} is a GPU build"
        passed_over = f" (the local CPU-only wheel {wheel.name} is passed over)" if wheel is not None else ""
        return [f"torch==={TORCH_VERSION}"], ("an NVIDIA GPU is present: the CUDA build from pip's own indexes"
                                              + passed_over)
    if wheel is not None:
        return [package], f"the local wheel {wheel.name} (pip's find-links)"
    return [package, "--index-url", CPU_INDEX], ("no GPU: the CPU-only build from PyTorch's index (set "
                                                 f"{VARIABLE}=default for pip's own choice)")


def _pip_config() -> str:
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout


def main() -> int:
    arguments, why = choose(os.environ, find_links(os.environ, _pip_config), has_nvidia_gpu())
    print(f"torch: {why}", file=sys.stderr)
    print("\n".join(arguments))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
