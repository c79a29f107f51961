"""Tests of the real parts together: the bot on loopback, real MindSpore training, the CLI, subprocesses."""
