"""Textual UI tests: pilot tests on the real engine, snapshots on a scripted session."""
