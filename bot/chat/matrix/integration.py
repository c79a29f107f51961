"""Matrix as the app assembles it: room messages with charts (receiver.py) and `!msmon` commands read by a
/sync loop (inbound.py) while the bot runs."""

from __future__ import annotations

import os

from bot.integration import Context, Integration, Task
from bot.receivers import Receiver


class Matrix(Integration):
    name = "matrix"
    section = "matrix"  # its bot.yaml section, bot.matrix (bot/config.py)

    def receiver(self, ctx: Context) -> Receiver | None:
        mx = ctx.cfg.matrix
        if not mx.homeserver:
            return None
        from bot.chat.matrix.receiver import MatrixReceiver

        return MatrixReceiver(mx.homeserver, mx.user_id, os.environ.get(mx.token_env, ""), mx.timeout,
                              ctx.cfg.console.charts)


    def task(self, ctx: Context) -> Task | None:
        mx = ctx.cfg.matrix
        if not (mx.homeserver and mx.rooms):
            return None
        from bot.chat.matrix.inbound import MatrixInbound

        return MatrixInbound(mx, os.environ.get(mx.token_env, ""), ctx.svc)
