"""Screens of the Textual app: chat, memory browser, import, settings, dialogs."""
