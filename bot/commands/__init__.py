"""Chat and CLI commands: one language (`parse.py`) shared by Slack's `/msmon ...`, `msmon cmd "..."` and later IMs."""
