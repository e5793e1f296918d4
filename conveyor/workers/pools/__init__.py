"""Stateless-worker pools: grown on demand, shrunk under a PID controller."""
