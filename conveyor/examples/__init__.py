"""Example apps shipped with Conveyor (used by ``conveyor demo`` and the tests)."""
