"""`msmon demo` as a newcomer meets it (issue 19): run from a folder outside the repository with no --config (the
default config ships in the package), part 2's fault is a wrong LR schedule that msmon flags at once, and the
console reads as a story: a command and its answer together, each alert resolved once, command ids without
gaps, `status` naming steps that were printed above, and an ending that says what to try next."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fakes.helpers import msmon

pytest.importorskip("aiohttp")
pytest.importorskip("mindspore")

ALERT = re.compile(r"^\[msmon\] (?:  re: |update: )?(WARNING|ERROR|RESOLVED) (\w+): "
                   r"run (\S+), device \d+, step (\d+)$")


@pytest.mark.mindspore
@pytest.mark.slow
def test_the_demo_reads_as_a_story_from_outside_the_repository(tmp_path: Path) -> None:
    elsewhere = tmp_path / "somewhere"
    elsewhere.mkdir()
    p = msmon("demo", "--out", str(tmp_path / "out"), cwd=elsewhere)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    lines = out.splitlines()
    part2 = out.split("msmon demo, part 2")[1]

    # the fault is the schedule itself: msmon flags it at the step it starts, and an ERROR follows soon after
    caught = re.search(r"The bad schedule started at step (\d+): msmon's first alert was WARNING lr_schedule at "
                       r"step (\d+); the first ERROR, \w+, at step (\d+)", out)
    assert caught, out[-2000:]
    at, first, error = map(int, caught.groups())
    assert at <= first <= at + 2 and error - at <= 50

    # every alert of the run, in step order, and each resolved once
    seen = [(m.group(1), m.group(2), m.group(3), int(m.group(4))) for m in map(ALERT.match, lines) if m]
    ms = [a for a in seen if a[2] == "demo-ms"]
    steps = [a[3] for a in ms]
    assert steps == sorted(steps), ms
    assert not any("update: " in line for line in lines)
    assert "(in reply to" not in out  # the receiver's own message ids meant nothing to a reader
    for rule in {a[1] for a in ms}:
        kinds = [a[0] for a in ms if a[1] == rule]
        assert all(not (x == y == "RESOLVED") for x, y in zip(kinds, kinds[1:], strict=False)), (rule, kinds)

    # issue 24: the LR shift is not "back to normal" by itself: lr_schedule resolves only after scale-lr puts it back
    scaled = next(i for i, line in enumerate(lines) if line.startswith('$ msmon cmd "scale-lr'))
    back = [i for i, line in enumerate(lines) if (m := ALERT.match(line)) and m.group(1) == "RESOLVED"
            and m.group(2) == "lr_schedule" and m.group(3) == "demo-ms"]
    assert all(i > scaled for i in back), (back, scaled)

    # a command and its answer are one piece, ids without gaps
    blocks = part2.split("\n$ msmon cmd ")[1:]
    assert len(blocks) == 6
    ids = []
    for block in blocks:
        first_lines = block.splitlines()
        answer = first_lines[1]
        assert not answer.startswith("[msmon]"), block
        ids.append(int(re.search(r"\bc(\d+)\b", answer).group(1)))  # "queued as c1", "c3: *demo-ms* ..."
        done = [i for i, line in enumerate(first_lines) if re.match(r"c\d+ done: ", line)]
        if done:  # nothing the bot delivered came between the command and its result
            assert not any(line.startswith("[msmon]") for line in first_lines[1:done[0]]), block
    assert ids == list(range(1, 7)), ids

    # status names the steps the reader saw
    status = next(b for b in blocks if b.startswith('"status demo-ms"'))
    printed = {(a[1], a[3]) for a in ms if a[0] != "RESOLVED"}
    for rule, step in re.findall(r"FIRING \w+ (\w+) on device \d+ since step ([\d,]+)", status):
        assert (rule, int(step.replace(",", ""))) in printed, (rule, step, printed)

    assert "What to try next:" in out and "config/bot.local.yaml" in out.split("What to try next:")[1]
