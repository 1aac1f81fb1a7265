"""NodeStore: a node's adapter, Adam moments and JSON state survive a save and a load, without pickle, and a state
file someone edited is refused naming the file and the field."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import save_file

from pubswap_flwr.node_runtime.state import OLD_OPTIMIZER_FILE, OPTIMIZER_FILE, NodeState, NodeStore
from pubswap_flwr.rollouts import Completion, RolloutGroup
from pubswap_flwr.tasks import TaskItem


def _trained(policy):
    group = RolloutGroup(policy.prompts([TaskItem("u", "t", "q", "2", "exact")])[0],
                         [Completion("<answer>2</answer>"), Completion("<answer>3</answer>")], [1.0, 0.0])
    policy.update([group])
    return policy


def _moments(policy) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in policy.learner.optimizer_tensors()[0].items()}


def _assert_moments_are(policy, moments: dict[str, torch.Tensor]) -> None:
    loaded = _moments(policy)
    assert loaded.keys() == moments.keys() and all(torch.equal(loaded[k], moments[k]) for k in moments)


def test_a_saved_node_loads_its_adapter_moments_and_counters(tiny_policy, tmp_path):
    policy = _trained(tiny_policy)
    store = NodeStore(tmp_path, "m")
    store.save(policy, NodeState(model_name="m", steps=7))
    adapter, moments = {k: v.clone() for k, v in policy.adapter().items()}, _moments(policy)
    assert (tmp_path / OPTIMIZER_FILE).is_file() and not (tmp_path / OLD_OPTIMIZER_FILE).exists()
    _trained(policy)  # moves the adapter and the moments on
    policy.learner.reset_optimizer()
    state = store.load(policy)
    assert state.steps == 7
    assert all(torch.equal(policy.adapter()[k], adapter[k]) for k in adapter)
    _assert_moments_are(policy, moments)


def test_a_state_dir_from_before_the_safetensors_moments_still_loads_them(tiny_policy, tmp_path):
    policy = _trained(tiny_policy)
    store = NodeStore(tmp_path, "m")
    store.save(policy, NodeState(model_name="m"))
    moments = _moments(policy)
    torch.save(policy.learner.optimizer.state_dict(), tmp_path / OLD_OPTIMIZER_FILE)
    (tmp_path / OPTIMIZER_FILE).unlink()
    policy.learner.reset_optimizer()
    store.load(policy)
    _assert_moments_are(policy, moments)


def test_moments_without_their_parameter_groups_are_refused_naming_the_file(tiny_policy, tmp_path):
    policy = _trained(tiny_policy)
    store = NodeStore(tmp_path, "m")
    store.save(policy, NodeState(model_name="m"))
    save_file(_moments(policy), str(tmp_path / OPTIMIZER_FILE))  # no metadata
    with pytest.raises(ValueError, match=f"{OPTIMIZER_FILE} has no param_groups metadata"):
        store.load(policy)


def test_a_round_start_snapshot_from_before_the_safetensors_moments_is_restored_whole(tiny_policy, tmp_path):
    """A snapshot that holds optimizer.pt (made before the change) is the round's start: the moments saved mid-round
    in the new file must not be loaded beside its node.json and adapter (they were: step 2 against steps 1)."""
    policy = _trained(tiny_policy)
    store = NodeStore(tmp_path, "m")
    store.save(policy, NodeState(model_name="m", steps=1))
    torch.save(policy.learner.optimizer.state_dict(), tmp_path / OLD_OPTIMIZER_FILE)  # as the old code wrote it
    (tmp_path / OPTIMIZER_FILE).unlink()
    snapshot = tmp_path / "round-start"
    snapshot.mkdir()
    for name in ("node.json", "adapter.safetensors", OLD_OPTIMIZER_FILE):
        (snapshot / name).write_bytes((tmp_path / name).read_bytes())
    (snapshot / "round").write_text("3")
    start = _moments(policy)
    _trained(policy)  # mid-round: the new code saves the moments in the new file and drops the old one
    store.save(policy, NodeState(model_name="m", steps=2))
    assert (tmp_path / OPTIMIZER_FILE).is_file() and not (tmp_path / OLD_OPTIMIZER_FILE).exists()
    store.restore_round_start()
    assert not (tmp_path / OPTIMIZER_FILE).exists()
    policy.learner.reset_optimizer()
    assert store.load(policy).steps == 1
    _assert_moments_are(policy, start)


def test_an_optimizer_file_that_is_not_safetensors_or_lacks_a_moment_is_refused_naming_it(tiny_policy, tmp_path):
    policy = _trained(tiny_policy)
    store = NodeStore(tmp_path, "m")
    store.save(policy, NodeState(model_name="m"))
    moments, groups = policy.learner.optimizer_tensors()
    partial = {k: v.clone() for k, v in moments.items() if not k.endswith(".exp_avg_sq")}
    save_file(partial, str(tmp_path / OPTIMIZER_FILE), metadata={"param_groups": groups})
    with pytest.raises(ValueError, match=rf"{OPTIMIZER_FILE}: optimizer state 0 holds \['exp_avg', 'step'\]"):
        store.load(policy)
    (tmp_path / OPTIMIZER_FILE).write_bytes(b"\x00" * 12)
    with pytest.raises(ValueError, match=f"{OPTIMIZER_FILE} is not a safetensors file"):
        store.load(policy)


def test_a_node_state_round_trips_through_its_json(tmp_path):
    state = NodeState(model_name="m", rounds=2, steps=9, cumulative_reward=0.75, last_round=2,
                      mode={"pending": [{"uid": "a"}], "peers": {"n1": [3, 1]}})
    state.cursor.next_index["gcd"] = 4
    back = NodeState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back == state and back.mode["peers"] == {"n1": [3, 1]} and back.cursor.next_index == {"gcd": 4}


@pytest.mark.parametrize("change, reason", [
    ({"steps": "7"}, "steps: expected `int`, got `str`"),
    ({"steps": 7.0}, "steps: expected `int`, got `float`"),
    ({"rounds": -1}, "rounds: expected `int` >= 0"),
    ({"cumulative_reward": float("inf")}, "cumulative_reward: expected `float` <= 1000000000000000.0"),
    ({"mode": [1]}, "mode: expected `object`, got `array`"),
    ({"cursor": {"draws": "x"}}, "cursor.draws: expected `int`, got `str`"),
])
def test_an_edited_state_file_is_refused_naming_the_file_and_the_field(tiny_policy, tmp_path, change, reason):
    store = NodeStore(tmp_path, "m")
    store.save(tiny_policy, NodeState(model_name="m", steps=3))
    path = tmp_path / "node.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(ValueError) as caught:
        store.load(tiny_policy)
    assert str(caught.value) == f"{path}: {reason}"


def test_a_state_file_that_is_not_json_is_refused_naming_the_file(tiny_policy, tmp_path):
    store = NodeStore(tmp_path, "m")
    store.save(tiny_policy, NodeState(model_name="m"))
    (tmp_path / "node.json").write_text("{")
    with pytest.raises(ValueError, match=r"node\.json: not valid JSON \(Expecting property name"):
        store.load(tiny_policy)


def test_a_numpy_number_in_a_pending_group_is_saved_as_the_number_it_holds(tiny_policy, tmp_path):
    import numpy as np

    store = NodeStore(tmp_path, "m")
    metadata = {"difficulty": np.float64(0.5), "terms": np.int64(3)}  # as reasoning-gym's metadata may hold
    store.save(tiny_policy, NodeState(model_name="m", mode={"pending": [{"item": {"metadata": metadata}}]}))
    assert store.load(tiny_policy).mode == {"pending": [{"item": {"metadata": {"difficulty": 0.5, "terms": 3}}}]}


@pytest.mark.parametrize("old, mode", [
    ({"peers": {"n1": [3, 1]}, "pending_sapo": [], "pending_public": {}}, {"pending": [], "peers": {"n1": [3, 1]}}),
    ({"pending_public": {"public/gcd/1": [{"text": "a", "ids": [1, 2]}]}, "pending_sapo": [], "peers": {}},
     {"pending": {"public/gcd/1": [{"text": "a", "ids": [1, 2]}]}}),
    ({"pending_public": {}, "pending_sapo": [], "peers": {}}, {}),
])
def test_a_state_file_from_before_the_family_states_keeps_its_family_keys(tiny_policy, tmp_path, old, mode):
    store = NodeStore(tmp_path, "m")
    store.save(tiny_policy, NodeState(model_name="m", steps=3))
    path = tmp_path / "node.json"
    saved = json.loads(path.read_text())
    del saved["mode"]
    path.write_text(json.dumps({**saved, **old}))  # as the code before 2026-12-04 wrote it
    loaded = store.load(tiny_policy)
    assert loaded.mode == mode and loaded.steps == 3


# --- a state file that is not a regular file, or a bad round marker (issue #54 class 6) ---------------------------
# Only a missing file means a fresh node; anything else at a state file's name that the node did not write (a FIFO,
# a folder, a device, a link to anywhere) is an error naming the file and what it is: the node must not silently
# start its training over, follow the link, or block opening the FIFO.

def _make(kind: str, path, target=None) -> str:
    """Put a `kind` thing at `path` (a saved file there is removed first); the words the error must use for it."""
    import os
    import stat

    if path.is_file() and not path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        return "a FIFO"
    if kind == "folder":
        path.mkdir()
        return "a folder"
    if kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
        except PermissionError:
            pytest.skip("this user cannot make a device file")
        return "a device"
    if kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
        return "a link (to /dev/zero)"
    path.symlink_to(target)  # a link to a good copy: still not followed
    return f"a link (to {target})"


def _refused(path, what: str, expected: str = "a regular file") -> str:
    """The start of the refusal of `path`, as a regular expression."""
    return "^" + re.escape(f"{path}: {what}, not {expected}")


KINDS = ["fifo", "folder", "device", "link to /dev/zero", "link to a good copy"]


@pytest.mark.parametrize("kind", KINDS)
def test_node_state_file_that_is_not_a_regular_file_is_refused_not_a_fresh_node(tiny_policy, tmp_path, kind):
    from pubswap_flwr.untrusted import UntrustedFileError

    store = NodeStore(tmp_path / "node", "m")
    store.save(tiny_policy, NodeState(model_name="m", steps=3))
    copy = tmp_path / "copy.json"
    copy.write_bytes((tmp_path / "node" / "node.json").read_bytes())
    path = tmp_path / "node" / "node.json"
    what = _make(kind, path, copy)
    with pytest.raises(UntrustedFileError) as caught:
        store.load(tiny_policy)
    assert str(caught.value).startswith(f"{path}: {what}, not a regular file")
    assert "a node's state is read only from the regular files it wrote" in str(caught.value)


@pytest.mark.parametrize("name", ["adapter.safetensors", OPTIMIZER_FILE, OLD_OPTIMIZER_FILE])
@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "link to a good copy"])
def test_node_state_tensor_file_that_is_not_a_regular_file_is_refused(tiny_policy, tmp_path, name, kind):
    from pubswap_flwr.untrusted import UntrustedFileError

    policy = _trained(tiny_policy)
    store = NodeStore(tmp_path / "node", "m")
    store.save(policy, NodeState(model_name="m"))
    if name == OLD_OPTIMIZER_FILE:  # read only when no optimizer.safetensors exists
        torch.save(policy.learner.optimizer.state_dict(), tmp_path / "copy")
        (tmp_path / "node" / OPTIMIZER_FILE).unlink()
    else:
        (tmp_path / "copy").write_bytes((tmp_path / "node" / name).read_bytes())
    path = tmp_path / "node" / name
    what = _make(kind, path, tmp_path / "copy")
    with pytest.raises(UntrustedFileError, match=_refused(path, what)):
        store.load(policy)


@pytest.mark.parametrize("kind", ["fifo", "folder", "link to /dev/zero"])
def test_node_state_reference_and_compression_files_that_are_not_regular_files_are_refused(tmp_path, kind):
    import numpy as np

    from pubswap_flwr.node_runtime.state import GLOBAL_FILE, REFERENCE_FILE
    from pubswap_flwr.untrusted import UntrustedFileError

    store = NodeStore(tmp_path, "m")
    store.save_reference({"w": torch.ones(2)})
    store.save_arrays(GLOBAL_FILE, {"w": np.ones(2)})
    for path, load in ((tmp_path / REFERENCE_FILE, store.load_reference),
                       (tmp_path / GLOBAL_FILE, lambda: store.load_arrays(GLOBAL_FILE))):
        what = _make(kind, path)
        with pytest.raises(UntrustedFileError, match=_refused(path, what)):
            load()


def test_node_state_missing_files_are_a_fresh_node(tiny_policy, tmp_path):
    from pubswap_flwr.node_runtime.state import GLOBAL_FILE

    store = NodeStore(tmp_path / "new", "m")
    assert store.load(tiny_policy) == NodeState(model_name="m")
    assert store.load_reference() is None and store.load_arrays(GLOBAL_FILE) is None
    assert not store.has_round_start(1)


@pytest.mark.parametrize("marker", ["abc", "", "-1", "1.5", "³", "2 3"])
def test_node_state_bad_round_marker_names_the_file_and_the_value(tiny_policy, tmp_path, marker):
    from pubswap_flwr.untrusted import UntrustedFileError

    store = NodeStore(tmp_path, "m")
    store.save(tiny_policy, NodeState(model_name="m"))
    store.snapshot_round_start(2)
    path = tmp_path / "round-start" / "round"
    assert store.has_round_start(2) and not store.has_round_start(3)
    path.write_text(marker)
    with pytest.raises(UntrustedFileError) as caught:
        store.has_round_start(2)
    assert str(caught.value) == f"{path}: round marker {marker!r} is not a round number"


@pytest.mark.parametrize("kind", ["fifo", "folder", "link to a good copy"])
def test_node_state_round_marker_that_is_not_a_regular_file_is_refused(tiny_policy, tmp_path, kind):
    from pubswap_flwr.untrusted import UntrustedFileError

    store = NodeStore(tmp_path / "node", "m")
    store.save(tiny_policy, NodeState(model_name="m"))
    store.snapshot_round_start(2)
    (tmp_path / "copy").write_text("2")
    path = tmp_path / "node" / "round-start" / "round"
    what = _make(kind, path, tmp_path / "copy")
    with pytest.raises(UntrustedFileError, match=_refused(path, what)):
        store.has_round_start(2)


def test_node_state_round_start_folder_that_is_a_link_is_refused(tiny_policy, tmp_path):
    from pubswap_flwr.untrusted import UntrustedFileError

    store = NodeStore(tmp_path / "node", "m")
    store.save(tiny_policy, NodeState(model_name="m"))
    store.snapshot_round_start(2)
    (tmp_path / "node" / "round-start").rename(tmp_path / "elsewhere")
    (tmp_path / "node" / "round-start").symlink_to(tmp_path / "elsewhere")
    path = tmp_path / "node" / "round-start"
    with pytest.raises(UntrustedFileError, match=_refused(path, f"a link (to {tmp_path / 'elsewhere'})", "a folder")):
        store.has_round_start(2)


def test_node_state_snapshot_file_that_is_a_link_is_not_restored(tiny_policy, tmp_path):
    from pubswap_flwr.untrusted import UntrustedFileError

    store = NodeStore(tmp_path / "node", "m")
    store.save(tiny_policy, NodeState(model_name="m", steps=1))
    store.snapshot_round_start(2)
    store.save(tiny_policy, NodeState(model_name="m", steps=2))
    (tmp_path / "other.json").write_text(json.dumps(NodeState(model_name="m", steps=99).to_dict()))
    path = tmp_path / "node" / "round-start" / "node.json"
    path.unlink()
    path.symlink_to(tmp_path / "other.json")
    with pytest.raises(UntrustedFileError, match=_refused(path, f"a link (to {tmp_path / 'other.json'})")):
        store.restore_round_start()
    assert store.load(tiny_policy).steps == 2  # nothing was copied from the link
