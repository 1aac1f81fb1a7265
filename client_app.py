"""pubswap-flwr ClientApp: every message (train, query.generate) goes to the node's handler."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from pubswap_flwr.client import handle

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    return handle(msg, context)


@app.query("generate")
def generate(msg: Message, context: Context) -> Message:
    return handle(msg, context)
