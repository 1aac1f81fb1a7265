"""pubswap-flwr ClientApp: every protocol's message types (train.<action>, query.<action>), served in this process
or, on a deployed node with `deploy.warm-worker`, by the node's warm worker (pubswap_flwr/node/app.py)."""

from pubswap_flwr.node.app import build_client_app

app = build_client_app()
