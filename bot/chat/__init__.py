"""The chat platforms, one folder each: its way in (inbound: signed requests become commands), its receiver
(alerts out) and, for Slack, Socket Mode. No platform imports another (import-linter); what they share is
here: replay.py (a signed request counts once) and robot.py / robots.py (the webhook robots' signatures,
send budgets and summaries, for Feishu, DingTalk and WeCom)."""
