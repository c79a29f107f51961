"""WeCom: the group robot's markdown and chart images (receiver.py)."""
