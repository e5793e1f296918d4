"""The web console: ``conveyor console`` (see docs/console.md).

:mod:`~conveyor.console.poller` reads the broker in one loop shared by every page,
:mod:`~conveyor.console.actions` replays, purges and deletes through the functions the
CLI uses, :mod:`~conveyor.console.server` serves pages and the JSON API; the command that starts
it is :mod:`conveyor.cli.console`.
"""
