"""Job actions applied at a step boundary: save_checkpoint, pause/resume, scale_lr, rewind, clip_grad, the threshold
actions, acknowledge, stop; and the health checkpoints a rewind loads.

Requests may come from any thread (a rule's `actions:`, code, the bot's chat commands); they queue here and run on
the training thread between two steps, the only place where the weights are consistent and a checkpoint is
meaningful. The package follows that flow:

- order.py: `CommandOrder` (pure) decides what applies when, in the order the bot accepted the commands;
- job.py: `JobControl` takes the requests and carries the decisions out (the pause's wait is its own);
- actions.py: `Actions`, one method per action of msmon/contract/actions.py, and `HANDLERS`, checked against that
  table at import (pause and resume are CommandOrder's own);
- ring.py: the health checkpoints (`HealthRing`); rewind.py: a rewind, all or none across ranks (`Rewinder`);
- backend.py: what an action asks of the framework (`Backend`, `RewindBackend`; notifier/mindspore/backend.py is
  MindSpore's). Without one, a custom loop still gets pause, resume and the threshold commands; the others answer
  that they need a backend.
"""

from .actions import HANDLERS, ORDER_ACTIONS, Actions
from .backend import ActionError, Backend, Moot, RewindBackend
from .job import JobControl
from .order import CommandOrder, Outcome, Request, acceptance_order

__all__ = ["HANDLERS", "ORDER_ACTIONS", "ActionError", "Actions", "Backend", "CommandOrder", "JobControl", "Moot",
           "Outcome", "Request", "RewindBackend", "acceptance_order"]
