"""What crosses the network between the server and the nodes: codecs (adapters, size-limited JSON payloads), the
records every protocol's messages share, the counters a reply carries, compressed adapters, and the checks every
reply passes before anything is aggregated, verified or pooled."""
