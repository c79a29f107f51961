"""Matrix: `!msmon` commands read by a /sync loop (inbound.py) and room messages with charts (receiver.py)."""
