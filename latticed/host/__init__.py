"""This host's files, keys, configuration and checks: what ``latticed init`` writes and ``latticectl
doctor`` reads, the network key and invites, the data directory's lock and identity key, the API socket's
path, free disk space, which interfaces mDNS uses, whether the replication port is free, and the retention
policies and caps the configuration names.

No trio, no storage engine, no network service: the CLI imports this package on every command, so it must
stay cheap (``tests/test_lazy_imports.py``). May import the public errors and version, the pure packages
(``crdt``, ``protocol`` value types) and ``process`` (logging).
"""
