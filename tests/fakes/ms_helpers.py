"""Tiny real MindSpore trainings for the integration tests (CPU, GRAPH mode, a few seconds each): the
toy job that ships with msmon (notifier/mindspore/toy.py)."""

from __future__ import annotations

import mindspore as ms

from notifier.mindspore.toy import MLP, dataset, model, regression_data

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

__all__ = ["MLP", "dataset", "model", "regression_data"]
