"""docs/ARCHITECTURE.md stays true: every file and folder it names exists, and its walks of one event and one
command name at most 15 and 12 files (the layout's promise to a reader)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
PATH = re.compile(r"`((?:bot|notifier|msmon|tests|bench|tools|config|docs)/[\w./<>-]*)`")


def _section(title: str) -> str:
    start = DOC.index(f"## {title}")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end]


def test_every_path_the_architecture_names_exists() -> None:
    named = {m for m in PATH.findall(DOC) if "<" not in m}
    missing = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists())
    assert named and not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {missing}"


def _walk_files(title: str) -> list[str]:
    """The files a walk's numbered steps lead with (`N. \\`path\\``), in order."""
    return re.findall(r"^\d+\. `([\w/.]+\.py)`", _section(title), re.M)


def test_the_walk_of_one_event_names_at_most_15_files_from_the_step_to_the_chat_call() -> None:
    files = _walk_files("The path of one event")
    assert files[0] == "notifier/mindspore/callback.py" and files[-2] == "bot/chat/slack/receiver.py"
    assert len(set(files)) <= 15, files


def test_the_walk_of_one_command_names_at_most_12_files_and_one_way_to_the_job() -> None:
    files = _walk_files("The path of one command")
    assert files[0] == "bot/chat/slack/inbound.py" and "notifier/control/job.py" in files
    assert len(set(files)) <= 12, files
    assert "the ingest answer carries none, and the job reads none there" in _section("The path of one command")
    import notifier.transport as job_side

    assert not hasattr(job_side, "IngestAnswer")  # and so the code: the job decodes no commands from an ingest answer
