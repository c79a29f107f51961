"""The log line users already know: `[step 100] loss: 2.341 | lr: 1.2e-5 | grad_norm: 1.02 | ...`."""

from __future__ import annotations

from msmon.contract.wire import Sample


def _sci(x: float) -> str:
    """1.2e-05 -> 1.2e-5: the short form people write."""
    text = f"{x:.3g}"
    if "e" in text:
        mant, exp = text.split("e")
        text = f"{mant}e{int(exp)}"
    return text


def format_log_line(s: Sample, with_device: bool = False) -> str:
    parts = []
    if s.loss is not None:
        parts.append(f"loss: {s.loss:.4g}")
    if s.learning_rate is not None:
        parts.append(f"lr: {_sci(s.learning_rate)}")
    if s.grad_norm is not None:
        parts.append(f"grad_norm: {s.grad_norm:.3g}")
    if s.local_grad_norm is not None:
        parts.append(f"local_grad_norm: {s.local_grad_norm:.3g}")
    if s.tokens_per_s is not None:
        parts.append(f"throughput: {s.tokens_per_s:.0f} tokens/s")
    elif s.samples_per_s is not None:
        sps = s.samples_per_s
        parts.append(f"throughput: {sps:.0f} samples/s" if sps >= 100 else f"throughput: {sps:.3g} samples/s")
    head = f"[step {s.step}]" + (f" [device {s.device}]" if with_device else "")
    return f"{head} " + " | ".join(parts) if parts else head
