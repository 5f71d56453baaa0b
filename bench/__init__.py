"""Benchmarks: every figure is a ratio against prompt injection measured in the same run.

``inferscale-assistant bench …`` runs them; each writes raw samples as JSON.
"""
