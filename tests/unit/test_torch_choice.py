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
    assert choice.choose({}, [], gpu=True)[0] == ["torch===2.13.0"]


CPU_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
CPU_INDEX_ARGS = ["torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu"]


@pytest.mark.parametrize("gpu, local_wheel, override, expected, reason", [
    (False, False, None, CPU_INDEX_ARGS, "no GPU"),
    (False, True, None, ["torch==2.13.0"], CPU_WHEEL),
    # '===' matches the version string exactly: PyPI's CUDA build (2.13.0), never the local 2.13.0+cpu, which pip
    # would otherwise prefer (a local version label sorts above the plain version)
    (True, False, None, ["torch===2.13.0"], "NVIDIA GPU"),
    (True, True, None, ["torch===2.13.0"], "passed over"),
    (False, False, "cpu", CPU_INDEX_ARGS, "PUBSWAP_TORCH=cpu"),
    (False, True, "cpu", CPU_INDEX_ARGS, "PUBSWAP_TORCH=cpu"),
    (True, False, "default", ["torch==2.13.0"], "PUBSWAP_TORCH=default"),
    (True, True, "default", ["torch==2.13.0"], "PUBSWAP_TORCH=default"),
])
def test_the_choice_table_prefers_the_gpu_build_over_a_local_cpu_wheel(choice, tmp_path, gpu, local_wheel, override,
                                                                      expected, reason):
    if local_wheel:
        (tmp_path / CPU_WHEEL).write_bytes(b"")
    env = {} if override is None else {"PUBSWAP_TORCH": override}
    arguments, why = choice.choose(env, [str(tmp_path)], gpu=gpu)
    assert arguments == expected and reason in why


def test_a_local_gpu_build_wheel_is_taken_with_a_gpu(choice, tmp_path):
    (tmp_path / "torch-2.13.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    arguments, why = choice.choose({}, [str(tmp_path)], gpu=True)
    assert arguments == ["torch==2.13.0"] and "torch-2.13.0+cu128" in why


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
