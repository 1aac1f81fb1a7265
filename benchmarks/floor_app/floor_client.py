"""Flower floor ClientApp: replies to every `train.segment` at once with an empty record (or `reply-bytes` bytes)."""

from floor_payload import payload
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train("segment")
def segment(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    size, seed = int(config["reply-bytes"]), f"up {config['server-round']} {context.node_id}"
    content = RecordDict({"payload": payload(size, int(config["arrays"]), seed)} if size else {})
    return Message(content, reply_to=msg)
