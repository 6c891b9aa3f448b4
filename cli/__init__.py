"""Command-line entry points: ``latticed`` (:mod:`cli.latticed_command`) and ``latticectl`` (:mod:`cli.ctl`).

Both turn errors into exit codes at one boundary, :class:`cli.boundary.BoundaryGroup`; the codes are
listed once, in :class:`cli.boundary.ExitCode`.
"""
