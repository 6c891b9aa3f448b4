"""The local API: msgpack requests over a Unix socket (server, protocol) and the blocking client."""
