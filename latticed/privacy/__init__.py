"""Private (sealed) queues and KV namespaces, the pure part: record envelopes, content keys wrapped to
readers, key epochs in the owner's signed metadata. No I/O, no clock, no randomness of its own (random
bytes come in as arguments, so every output is reproducible: docs/privacy.md's test vectors). Builds on
:mod:`latticed.crdt` only; the daemon side is :mod:`latticed.storage.sealer`."""
