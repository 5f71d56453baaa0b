"""The Textual chat: the app, its screens and widgets, and the thread that hosts the session."""
