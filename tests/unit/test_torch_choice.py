"""scripts/torch_choice.py: set-up installs the CPU-only torch without a GPU, the CUDA build with one, a local wheel
folder's when pip has one, and whatever PUBSWAP_TORCH says first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def choice():
    return load_script("scripts/torch_choice.py")


def test_no_gpu_and_no_local_wheel_takes_the_cpu_only_index(choice):
    arguments, why = choice.choose({}, [], gpu=False)
    assert arguments == ["torch==2.13.0", "--index-url", choice.CPU_INDEX] and "no GPU" in why
    assert choice.CPU_INDEX.endswith("/whl/cpu")


def test_a_gpu_takes_pips_own_indexes(choice):
    assert choice.choose({}, [], gpu=True)[0] == ["torch==2.13.0"]


def test_a_local_wheel_folder_wins_over_the_cpu_index_so_an_offline_machine_installs(choice, tmp_path):
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    arguments, why = choice.choose({}, [str(tmp_path)], gpu=False)
    assert arguments == ["torch==2.13.0"] and "torch-2.13.0+cpu" in why
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").unlink()
    (tmp_path / "torch-2.12.0-cp311-none.whl").write_bytes(b"")  # another version does not count
    assert "--index-url" in choice.choose({}, [str(tmp_path)], gpu=False)[0]


@pytest.mark.parametrize("value, expected", [
    ("cpu", ["torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu"]),
    ("default", ["torch==2.13.0"]),
    ("file:///srv/torch-index", ["torch==2.13.0", "--index-url", "file:///srv/torch-index"]),
])
def test_the_override_variable_wins_over_everything(choice, tmp_path, value, expected):
    (tmp_path / "torch-2.13.0-cp311-none.whl").write_bytes(b"")
    assert choice.choose({"PUBSWAP_TORCH": value}, [str(tmp_path)], gpu=True)[0] == expected


def test_find_links_come_from_the_environment_or_pips_config(choice):
    assert choice.find_links({"PIP_FIND_LINKS": "/opt/wheels /other"}, lambda: "") == ["/opt/wheels", "/other"]
    config = "global.cert='/etc/ssl/x.crt'\nglobal.find-links='/opt/wheels'\n"
    assert choice.find_links({}, lambda: config) == ["/opt/wheels"]
    assert choice.find_links({"PIP_FIND_LINKS": "https://example.invalid/links"}, lambda: "") == []  # not a folder


def test_a_gpu_is_seen_by_nvidia_smi_or_the_driver(choice, tmp_path):
    assert choice.has_nvidia_gpu(lambda name: "/usr/bin/nvidia-smi", tmp_path / "none")
    assert choice.has_nvidia_gpu(lambda name: None, tmp_path)
    assert not choice.has_nvidia_gpu(lambda name: None, tmp_path / "none")


def test_setup_installs_what_the_choice_prints():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "scripts/torch_choice.py" in setup and '"${TORCH_ARGS[@]}"' in setup
    assert 'pip install --quiet "torch==' not in setup  # no unconditional default-index torch
