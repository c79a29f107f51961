"""Slack: the slash command and buttons (inbound.py), Socket Mode (socket_mode.py), Block Kit messages (receiver.py)."""
