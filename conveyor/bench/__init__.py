"""Reproducible benchmarks behind ``conveyor bench``; each prints its baseline too."""
