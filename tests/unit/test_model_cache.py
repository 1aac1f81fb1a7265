"""The packaged-model cache against other local users (issue #34, item 4): a folder or cache that someone else
could have planted or changed is refused as the warm worker's directory is, the conversion lock never follows a
link or truncates anything, and a damaged converted folder is an error that names the folder to delete."""

from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace

import pytest

from pubswap_flwr.policy import packaged
from pubswap_flwr.policy.data import ModelError, data_dir
from pubswap_flwr.policy.model import load_causal_lm, resolve_model

NAME = "smollm2-135m-instruct"


@pytest.fixture()
def cache(monkeypatch, tmp_path):
    """A private cache root; converting writes a copy of the embedded tiny model with its marker."""
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv(packaged.CACHE_ENV, str(root))
    monkeypatch.setattr(packaged, "check_installed", lambda model: None)
    calls = []

    def convert(model, target):
        calls.append(target)
        shutil.copytree(data_dir() / "models" / "tiny", target)
        packaged.write_marker(target, {"name": model.name})  # what convert writes last

    monkeypatch.setattr(packaged, "convert", convert)
    return SimpleNamespace(root=root, calls=calls)


def _planted(path):
    shutil.copytree(data_dir() / "models" / "tiny", path)
    (path / packaged.MARKER).write_text(json.dumps({"name": NAME}))
    return path


def test_a_folder_of_another_user_is_not_loaded(cache, monkeypatch):
    folder = _planted(cache.root / NAME)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(folder).st_uid + 1)  # the folder is someone else's
    with pytest.raises(ModelError, match=rf"{folder} belongs to uid \d+, not to this user"):
        resolve_model(NAME)
    assert cache.calls == []


@pytest.mark.parametrize("how", ["group-writable folder", "group-writable cache", "linked folder"])
def test_a_folder_others_could_change_is_not_loaded(cache, tmp_path, how):
    if how == "linked folder":
        (cache.root / NAME).symlink_to(_planted(tmp_path / "elsewhere"))
        message = "must be a plain directory, not a link"
    elif how == "group-writable folder":
        _planted(cache.root / NAME).chmod(0o775)
        message = "has mode 775"
    else:
        _planted(cache.root / NAME)
        cache.root.chmod(0o777)
        message = "has mode 777"
    with pytest.raises(ModelError, match=message) as refused:
        resolve_model(NAME)
    assert str(cache.root) in str(refused.value) and packaged.CACHE_ENV in str(refused.value)
    assert cache.calls == []


def test_the_lock_never_follows_a_link_or_truncates(cache, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (cache.root / f".{NAME}.lock").symlink_to(victim)
    with pytest.raises(ModelError, match="lock"):
        resolve_model(NAME)
    assert victim.read_text() == "precious" and cache.calls == []

    (cache.root / f".{NAME}.lock").unlink()
    (cache.root / f".{NAME}.lock").write_text("kept")  # an ordinary lock file left by an earlier conversion
    assert resolve_model(NAME) == str(cache.root / NAME) and cache.calls == [cache.root / NAME]
    assert (cache.root / f".{NAME}.lock").read_text() == "kept"


def test_truncated_weights_behind_a_marker_name_the_folder_to_delete(cache):
    folder = _planted(cache.root / NAME)  # a marker of an older version: no file sizes recorded
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    location = resolve_model(NAME)
    with pytest.raises(ModelError, match=rf"delete {folder}") as failed:
        load_causal_lm(location)
    assert "SafetensorError" in str(failed.value) or "safetensors" in str(failed.value)


def test_a_converted_folder_records_its_file_sizes_and_a_short_file_is_refused(cache):
    folder = cache.root / NAME
    assert resolve_model(NAME) == str(folder)
    recorded = json.loads((folder / packaged.MARKER).read_text())["files"]
    assert recorded["model.safetensors"] == (folder / "model.safetensors").stat().st_size
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ModelError, match=rf"model.safetensors has 1000 bytes.*delete {folder}"):
        resolve_model(NAME)


def test_a_new_cache_is_made_private_enough_under_a_group_writable_umask(cache, monkeypatch):
    fresh = cache.root / "new"
    monkeypatch.setenv(packaged.CACHE_ENV, str(fresh))
    old = os.umask(0o002)  # many distributions' default: group-writable folders
    try:
        assert resolve_model(NAME) == str(fresh / NAME)
    finally:
        os.umask(old)
    assert os.stat(fresh).st_mode & 0o022 == 0
