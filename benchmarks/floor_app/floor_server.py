"""Flower floor ServerApp: each round sends every node the `segments` messages of a PubSwap round, one exchange after
another, with no work on either side; round times are written as a PubSwap run writes them.

The exchange is PubSwap's (pubswap_flwr/rounds/exchange.py): one push, then a pull every 0.1 s until every node
replied, so the floor pays Flower's own costs (the SuperNode's polls, a flwr-clientapp process per message, the
SuperLink's TLS round trips) and nothing of the project's. A round starts once `min-nodes` nodes are connected;
PubSwap's 1 s settle wait (`Exchange.select`) is the project's, not Flower's, and is left out.
"""

import json
import time
from pathlib import Path

from floor_payload import payload
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

PULL_INTERVAL = 0.1  # as pubswap_flwr.rounds.exchange.PULL_INTERVAL

app = ServerApp()


def wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(nodes := sorted(grid.get_node_ids())) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(nodes)} of {count} nodes connected after {timeout:.0f} s")
        time.sleep(0.2)
    return nodes


def exchange(grid: Grid, messages: list[Message], timeout: float) -> None:
    pending = {i for i in grid.push_messages(messages) if i}
    if len(pending) != len(messages):
        raise RuntimeError(f"the SuperLink took {len(pending)} of {len(messages)} messages")
    deadline = time.monotonic() + timeout
    while pending:
        for reply in grid.pull_messages(sorted(pending)):
            if reply.has_error():
                raise RuntimeError(f"node {reply.metadata.src_node_id}: error {reply.error.code}: "
                                   f"{reply.error.reason}")
            pending.discard(reply.metadata.reply_to_message_id)
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} replies missing after {timeout:.0f} s")
        if pending:
            time.sleep(PULL_INTERVAL)


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    segments, timeout = int(cfg["segments"]), float(cfg["timeout"])
    down, up, arrays = int(cfg["down-bytes"]), int(cfg["up-bytes"]), int(cfg["arrays"])
    run_dir = Path(str(cfg["output-dir"])) / str(cfg["run-name"])
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "metrics.jsonl").open("w", encoding="utf-8") as metrics:
        for number in range(1, int(cfg["num-server-rounds"]) + 1):
            started = time.time()
            nodes = wait_for_nodes(grid, int(cfg["min-nodes"]), timeout)
            walls = []
            for index in range(segments):
                last = index == segments - 1
                records = {"config": ConfigRecord({"server-round": number, "segment": index,
                                                   "reply-bytes": up if last else 0, "arrays": arrays})}
                if index == 0 and down:
                    records["payload"] = payload(down, arrays, f"down {number}")
                sent = time.time()
                exchange(grid, [Message(RecordDict(records), dst_node_id=node, message_type="train.segment")
                                for node in nodes], timeout)
                walls.append(time.time() - sent)
            row = {"round": number, "time": {"round_s": time.time() - started, "exchanges_s": walls}}
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()
