"""msmon bot: the service a team runs once for all its training jobs. Jobs post their samples and events
to it; it pages people in chat, and carries their commands back to the jobs that poll it.

    edge        server.py (`msmon serve`), app.py (the HTTP API, limits), assembly.py (the parts built, the
                background tasks),
                chat/<platform>/inbound.py (Slack's slash commands and buttons, with chat/slack/socket_mode.py;
                Matrix, Feishu, DingTalk), receivers/alertmanager/inbound.py
    ingest      ingest/envelope.py runs each event of an envelope through pipeline/'s STAGES (one pure stage
                a module, flow.py their one shape) into alert and outbox rows (delivery/payload.py); ingest/
                also keeps runs' attempts (runs.py), the watchdog (watchdog.py), overload and NATS
    state       shared.py (BotState, shared by ingest and commands), store/ (its contract, SQLite and
                PostgreSQL, alertindex.py, windows.py: recent metrics per run), runs/ and ranks/ (pure)
    delivery    delivery/worker.py (the worker, through pipeline/'s DELIVERY stages; plan.py, pure, decides
                each row), pipeline/schedule.py (its pure retry schedule), receivers/ (console, email,
                Alertmanager, a signed webhook), chat/<platform>/receiver.py (Slack, Matrix, Feishu,
                DingTalk, WeCom)
    escalation  escalation/: policy.py (pure: which level is due), scheduler.py (apscheduler, rebuilt from
                the store, a lease per escalation, signed ack links); delivery/digest.py (cron digests)
    commands    commands/: parse, auth, the service, the job side (jobs.py)
    also        config.py (bot.yaml), integrations.py (the chat platforms: one list), charts/ (draw.py,
                links.py), web/ (the console), metrics.py (/metrics)

It never imports the job runtime (`notifier`) or MindSpore; what the two share is msmon's own packages: the
contract (`msmon.contract`), `msmon.common`, `msmon.config` and `msmon.core` (import-linter contracts in
pyproject.toml).
"""
