"""The metric chart posted with an alert (draw.py: matplotlib's Agg canvas, off the event loop) and the
signed, expiring links that serve it to robots that cannot take an image (links.py)."""
