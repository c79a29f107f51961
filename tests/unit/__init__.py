"""Tests of one module or one pure state machine, in process: no server, no MindSpore training."""
