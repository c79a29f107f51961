"""msmon bot: the service a team runs once for all its training jobs. Jobs post their samples and events
to it; it pages people in chat, and carries their commands back to the jobs that poll it.

    edge        server.py (`msmon serve`), app.py (the HTTP API, auth, limits, background tasks),
                slack_inbound.py and socket_mode.py (Slack's way in: slash commands and buttons),
                matrix_, feishu_, dingtalk_inbound.py (the other chats'), alertmanager_inbound.py
    ingest      ingest.py runs each event of an envelope through pipeline/'s STAGES (one pure stage a
                module, flow.py their one shape) into alert and outbox rows (payload.py)
    state       state.py (BotState, shared by ingest and commands), store.py (SQLite), alertindex.py,
                windows.py (recent metrics per run)
    delivery    outbox.py (the worker, through pipeline/'s DELIVERY stages), delivery.py (its pure retry
                schedule), receivers/ (console, Slack, email, Matrix, Feishu, DingTalk, WeCom,
                Alertmanager, a signed webhook)
    escalation  escalation/: policy.py (pure: which level is due), scheduler.py (apscheduler, rebuilt from
                SQLite, a lease per escalation, signed ack links); digest.py (cron digests per channel)
    commands    commands/: parse, auth, the service, the job side (jobs.py)
    also        config.py (bot.yaml), watchdog.py (jobs gone or stalled), chart.py, metrics.py (/metrics)

It never imports the job runtime (`notifier`) or MindSpore: the contract (`msmon.contract`) is all the two
share (import-linter contracts in pyproject.toml).
"""
