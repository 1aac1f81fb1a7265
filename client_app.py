"""pubswap-flwr ClientApp: every protocol's message types (train.<action>, query.<action>) routed to its handler."""

from flwr.clientapp import ClientApp

from pubswap_flwr.protocols import register_client_handlers

app = register_client_handlers(ClientApp())
