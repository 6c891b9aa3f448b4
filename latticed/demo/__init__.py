"""``make demo``: a real run of daemons, replication and the Spark tail (:mod:`.walkthrough`).

The demo is a user of latticed, not a part of it: it may import anything, and nothing imports it.
"""
