"""Cells: reserved capacity for tenants."""
