"""Feishu/Lark: the app bot's event subscription (inbound.py) and the custom bot's cards (receiver.py)."""
