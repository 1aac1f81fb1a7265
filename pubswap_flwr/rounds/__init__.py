"""The server's round kit, below the protocols that use it: the exchange of messages with the nodes (exchange.py),
the round's log of what they reported (roundlog.py) and what a protocol's round works with (context.py)."""
