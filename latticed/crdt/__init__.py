"""Pure lattices and signed records: no I/O, no clocks (time comes in as arguments), no other latticed
imports. Everything that touches disks, sockets or time builds on this package."""
