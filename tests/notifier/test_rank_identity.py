"""Which rank a job's process is (notifier.world), and the start-up refusal of configured actions that one
rank of a multi-rank run would apply alone."""

from __future__ import annotations

import sys

import pytest

from msmon.config.errors import ConfigError
from notifier import Monitor
from notifier.world import World, detect
from tests.fakes.helpers import config

ACTIONS = [{"rule": "loss_spike", "severity": "ERROR", "action": "pause"},
           {"rule": "*", "severity": "ERROR", "action": "scale_lr", "factor": 0.5}]


@pytest.mark.parametrize(("env", "rank", "size", "device", "source"), [
    ({}, None, 1, None, "default"),
    ({"RANK_ID": "3", "RANK_SIZE": "8", "DEVICE_ID": "3"}, 3, 8, 3, "RANK_ID and RANK_SIZE"),  # MindFormers, rank table
    ({"MS_NODE_ID": "1", "MS_WORKER_NUM": "2", "MS_ROLE": "MS_WORKER"}, 1, 2, None, "MS_NODE_ID and MS_WORKER_NUM"),
    ({"RANK_ID": "1", "MS_NODE_ID": "1", "MS_WORKER_NUM": "4", "DEVICE_ID": "1"}, 1, 4, 1,
     "RANK_ID and MS_WORKER_NUM"),  # msrun
    ({"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "5"}, 5, 16, 5, "RANK and WORLD_SIZE"),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, 2, 4, 0,
     "OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE"),
    ({"RANK_ID": "3"}, 3, 4, None, "RANK_ID"),  # a rank without a size: a world at least that big
    ({"RANK_ID": "0"}, 0, 1, None, "RANK_ID"),
    ({"RANK_ID": "9", "RANK_SIZE": "2"}, 9, 10, None, "RANK_ID and RANK_SIZE"),  # inconsistent: rank wins
])
def test_rank_size_and_device_from_the_launchers_environment(env, rank, size, device, source):
    w = detect(env, modules={}, hostname="node-7")
    assert (w.rank, w.size, w.device_id, w.host, w.source) == (rank, size, device, "node-7", source)
    assert w.multi is (size > 1)


@pytest.mark.parametrize("bad", ["-1", "x", "", " 2 ", "1e3", "99999999999", "٣"])
def test_a_value_that_is_not_a_plain_rank_is_not_taken(bad):
    w = detect({"RANK_ID": bad, "RANK": "4", "WORLD_SIZE": "8"}, modules={}, hostname="h")
    expect = 2 if bad == " 2 " else 4  # surrounding blanks are taken, nothing else
    assert w.rank == expect


def test_mindspore_without_initialised_communication_leaves_the_environment_in_charge():
    pytest.importorskip("mindspore")
    import mindspore.communication  # noqa: F401 - what a job imports; init() not called

    w = detect({"RANK_ID": "1", "RANK_SIZE": "2"}, hostname="h")
    assert (w.rank, w.size, w.source) == (1, 2, "RANK_ID and RANK_SIZE")
    assert "mindspore.communication" in sys.modules


def test_a_multi_rank_run_without_a_bot_is_refused_at_start_up_naming_the_key():
    world = World(rank=1, size=2, host="node-1", source="RANK_ID and RANK_SIZE")
    with pytest.raises(ConfigError) as err:
        Monitor(config(actions=ACTIONS), "dp", sinks=[], world=world)
    text = str(err.value)
    assert "monitor_config.actions[0].action: pause cannot run in this 2-rank run (rank 1 of 2 on node-1" in text
    assert "monitor_config.actions[1].action: scale_lr" in text
    assert "no bot.url is set" in text and "blocked in the next collective" in text


def test_a_bot_that_sends_no_commands_is_refused_too(tmp_path):
    world = World(rank=0, size=4, host="h")
    cfg = config(actions=ACTIONS[:1], bot={"url": "http://127.0.0.1:9", "commands": False,
                                           "spool_dir": str(tmp_path / "spool")})
    with pytest.raises(ConfigError, match=r"actions\[0\]\.action: pause .* bot.commands is false"):
        Monitor(cfg, "dp", sinks=[], world=world)


def test_single_rank_runs_and_runs_without_actions_start_as_before():
    Monitor(config(actions=ACTIONS), "one", sinks=[], world=World(rank=0, size=1)).close()
    Monitor(config(), "dp", sinks=[], world=World(rank=1, size=2)).close()
    off = config(actions=ACTIONS)
    off["monitor_config"]["monitor_on"] = False  # nothing runs, nothing to refuse
    Monitor(off, "dp", sinks=[], world=World(rank=1, size=2)).close()
