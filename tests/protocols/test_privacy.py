"""Privacy audit: in fedavg and pubswap runs, every client->server message is captured and none contains a
private question or a private answer; only adapters and responses to public prompts leave a client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pubswap_flwr.config import ExperimentConfig
from pubswap_flwr.shared import task_universe
from pubswap_flwr.simulation import simulate_in_process as simulate
from pubswap_flwr.tasks import MixtureStream, StreamCursor, node_mixes, parse_mix
from tests.tiers import fast_only


def _capture_to(directory: Path):
    def hook(msg, context, reply):
        blobs = []
        if reply.has_content():
            for record in reply.content.values():
                for key, value in record.items():
                    blobs.append(key.encode())
                    if hasattr(value, "data"):  # an Array: its serialized bytes
                        blobs.append(bytes(value.data))
                    else:
                        blobs.append(json.dumps(value).encode() if not isinstance(value, (str, bytes)) else
                                     value.encode() if isinstance(value, str) else value)
        name = f"{context.node_config['partition-id']}-{msg.metadata.message_id}.bin"
        (directory / name).write_bytes(b"\n".join(blobs))
        return reply

    return hook


def _private_strings(config: dict, run_dir: Path, nodes: int) -> tuple[list[str], list[str]]:
    """Every private question each node drew (replayed from its saved stream cursor) and its answers."""
    cfg = ExperimentConfig.from_flat(config)
    universe = task_universe(cfg)
    mixes = node_mixes(parse_mix(cfg.tasks.mix), nodes, cfg.tasks.per_node)
    questions, answers = [], []
    for index in range(nodes):
        state = json.loads((run_dir / "nodes" / f"partition-{index}" / "node.json").read_text())
        draws = state["cursor"]["draws"]
        assert draws > 0
        stream = MixtureStream(mixes[index], universe.tasks, index, universe.training_exclude)
        for item in stream.take(draws, StreamCursor()):
            questions.append(item.question)
            answers.append(item.answer)
    return questions, answers


@pytest.mark.parametrize("mode", fast_only(["fedavg", "pubswap"], fast=["pubswap"]))
def test_no_private_question_or_answer_leaves_a_client(tmp_path, mode):
    captured = tmp_path / "captured"
    captured.mkdir()
    config = {"strategy.mode": mode, "num-server-rounds": 2, "train.local-steps": 3, "train.prompts-per-step": 4,
              "train.completions-per-prompt": 4, "pubswap.tau-swap": 2, "pubswap.public-prompts": 3,
              "eval.items-per-task": 5, "eval.samples": 1, "output.dir": str(tmp_path), "run-name": mode}
    simulate(config, 3, reply_hook=_capture_to(captured))
    messages = [p.read_bytes() for p in sorted(captured.iterdir())]
    assert len(messages) == (2 * 3 if mode == "fedavg" else 2 * 3 * 2)  # rounds x clients (x segments)
    questions, answers = _private_strings(config, tmp_path / mode, 3)
    assert len(questions) >= 3 * 2 * 2 * 4  # nodes x rounds x private steps x prompts
    # Short answers ("2", "7/9") also occur by chance in public responses and numbers; answers of 4+ characters
    # that no public item shares are specific enough to search for.
    public_answers = {i.answer for i in task_universe(ExperimentConfig.from_flat(config)).public.items}
    distinctive = sorted({a for a in answers if a and len(a) >= 4 and a not in public_answers})
    assert distinctive, "the audit needs some distinctive private answers to look for"
    for blob in messages:
        for question in questions:
            assert question.encode() not in blob, f"private question leaked: {question!r}"
        for answer in distinctive:
            assert answer.encode() not in blob, f"private answer leaked: {answer!r}"
    # The audit can see text when it is there: public questions' responses do travel in pubswap.
    if mode == "pubswap":
        assert any(b"<answer>" in blob for blob in messages)
