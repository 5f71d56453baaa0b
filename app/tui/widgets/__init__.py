"""Widgets of the Textual app: transcript, prompt, memory panel, conversation list, status."""
