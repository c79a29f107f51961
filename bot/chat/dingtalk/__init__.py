"""DingTalk: the enterprise robot's message callback (inbound.py) and the custom robot's markdown (receiver.py)."""
