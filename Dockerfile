# The msmon bot: a slim image with the bot's dependencies only (no MindSpore).
#   docker build -t msmon-bot .
# Its built-in config is config/bot.local.yaml (console receiver, one operator "cli:me" who may run every command),
# listening on all interfaces inside the container. Give it the jobs' token and the operator's token (two different
# secrets), and for Slack the bot token and the signing secret that verifies /slack/commands:
#   docker run -p 8080:8080 -e MSMON_TOKEN=... -e MSMON_OPERATOR_TOKEN=... \
#       -e SLACK_BOT_TOKEN=xoxb-... -e SLACK_SIGNING_SECRET=... -v msmon-state:/var/lib/msmon msmon-bot
# Routes to Slack, more operators (commands.operators, one token each) and who may do what (commands.allow) go in
# your own bot.yaml (every key: config/bot.yaml), mounted over the built-in one:
#   docker run ... -v $PWD/bot.yaml:/etc/msmon/bot.yaml:ro msmon-bot
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 MPLBACKEND=Agg
RUN useradd --create-home --uid 10001 msmon && mkdir -p /var/lib/msmon /etc/msmon \
    && chown msmon /var/lib/msmon
WORKDIR /app
COPY pyproject.toml README.md ./
COPY msmon ./msmon
COPY notifier ./notifier
COPY bot ./bot
RUN pip install --no-cache-dir '.[bot]'
COPY config/bot.local.yaml /etc/msmon/bot.yaml

USER msmon
WORKDIR /var/lib/msmon
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4).status == 200 else 1)"
CMD ["msmon", "serve", "--config", "/etc/msmon/bot.yaml", "--host", "0.0.0.0", "--port", "8080"]
