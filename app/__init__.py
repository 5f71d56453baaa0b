"""Textual UI and command line of InferScale assistant."""
