"""An example app and the tests a user writes for it (docs/testing.md shows them)."""
