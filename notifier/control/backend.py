"""What a job action asks of the training framework: the `Backend` and `RewindBackend` Protocols, and the two
answers an action gives instead of a result (`ActionError`: refused, and why; `Moot`: nothing left to do)."""

from __future__ import annotations

from typing import Any, Protocol


class ActionError(RuntimeError):
    """A job action that cannot be carried out; the message says why and what to do."""


class Backend(Protocol):
    """What JobControl asks of a training framework: the actions that touch its weights or optimizer.
    Called on the training thread, at a step boundary; raise ActionError to say what stands in the way."""

    def save_checkpoint(self, step: int, name: str) -> str:
        """Write a checkpoint of the weights at `step`; `name` is a file-safe stem naming the run, the
        device and the step (`run-42-device0-step500`). Returns the path written."""
        ...

    def scale_lr(self, factor: float) -> str:
        """Multiply the learning rate by `factor`; returns what changed, e.g. `lr 0.001 -> 0.0005`."""
        ...

    def stop(self, run_context: Any) -> None:
        """Ask the framework to end training after this step (`run_context`: what `apply` was given)."""
        ...


class RewindBackend(Backend, Protocol):
    """What a rewind and clip-grad need besides: a backend with these methods gets health checkpoints, `rewind` and
    `clip_grad` (notifier/mindspore/backend.py; examples/custom_loop.py's LoopBackend for a custom loop). Called on
    the training thread at a step boundary; raise ActionError to refuse.

    A rewind runs `read_checkpoint` (which must change nothing: parse and check the file against the model), then
    `seek_data` (if the data moves), then `restore` (which must not fail once read_checkpoint passed: if it does,
    the job stops rather than train on half-loaded weights). Two optional methods: `check_seek(position,
    run_context)` raises ActionError when `seek_data(position)` could not be honoured (past the data's end, sink
    mode), before anything moves; `agree(value, refused) -> (every rank holds value, the ranks that refused)` is one
    collective every rank of a multi-rank run calls at the rewind's step boundary, so all load or none does
    (MindSporeBackend has both)."""

    def save_checkpoint(self, step: int, name: str, directory: str | None = None) -> str:
        """As Backend's; `directory`: where (a health checkpoint's ring folder), None: the backend's own."""
        ...

    def read_checkpoint(self, path: str) -> Any:
        """Read and check the checkpoint at `path` without changing anything; what `restore` takes."""
        ...

    def restore(self, loaded: Any) -> str:
        """Put what read_checkpoint read into the model, the optimizer and the loss scale; says what it restored."""
        ...

    def data_position(self, run_context: Any) -> int | None:
        """Batches the training has read so far (None: not known)."""
        ...

    def seek_data(self, position: int, run_context: Any) -> str:
        """Make the next batch read the one at `position` (what data_position counts)."""
        ...

    def delete_checkpoint(self, path: str) -> None:
        """Remove a checkpoint the ring let go."""
        ...

    def clip_grad(self, max_norm: float) -> str:
        """Clip the global grad norm to `max_norm` from the next step on (0: no clipping); says what changed."""
        ...


class Moot(Exception):  # noqa: N818 - not an error: the answer of an action that has nothing left to do
    """An action answered without being applied (a rewind asked in an attempt already rewound)."""




__all__ = ["ActionError", "Backend", "Moot", "RewindBackend"]
