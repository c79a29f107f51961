# syntax=docker/dockerfile:1
# The msmon bot: a slim image with the bot's dependencies only (no MindSpore), installed from a lock with hashes.
#   docker build -t msmon-bot .                        # the common set: console, Slack, DingTalk, WeCom, email
#   docker build --build-arg LOCK=all -t msmon-bot .   # every platform, store and transport (Feishu, Matrix,
#                                                      # PostgreSQL, NATS too); other sets: tools/lock.sh EXTRA...
# Layers: the dependencies (rebuilt only when the lock changes), the config, then msmon itself, installed from
# the build context through a bind mount in one RUN: a code-only change rebuilds that one layer.
#
# Its built-in config is config/bot.local.yaml (console receiver, one operator "cli:me" who may run every command),
# listening on all interfaces inside the container. Give it the jobs' token and the operator's token (two different
# secrets; with neither set it refuses to start, as it would refuse every request), and for Slack the bot token and
# the signing secret that verifies /slack/commands:
#   docker run -p 8080:8080 -e MSMON_TOKEN=... -e MSMON_OPERATOR_TOKEN=... \
#       -e SLACK_BOT_TOKEN=xoxb-... -e SLACK_SIGNING_SECRET=... -v msmon-state:/var/lib/msmon msmon-bot
# Routes to Slack, more operators (commands.operators, one token each) and who may do what (commands.allow) go in
# your own bot.yaml (every key: docs/reference/bot-yaml.md), mounted over the built-in one:
#   docker run ... -v $PWD/bot.yaml:/etc/msmon/bot.yaml:ro msmon-bot
#
# The base image: pin it by digest where you build (this repository's build machine cannot reach a registry):
#   docker buildx imagetools inspect python:3.11-slim     # the "Digest:" line
#   docker build --build-arg PYTHON_IMAGE=python:3.11-slim@sha256:<that digest> -t msmon-bot .
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ARG LOCK=bot
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 MPLBACKEND=Agg
RUN useradd --create-home --uid 10001 msmon && mkdir -p /var/lib/msmon /etc/msmon \
    && chown msmon /var/lib/msmon

# 1. The dependencies, exactly as locked: nothing is resolved here, and a file whose hash differs is refused.
COPY requirements/build.lock.txt requirements/${LOCK}.lock.txt /tmp/lock/
RUN pip install --require-hashes --no-deps -r /tmp/lock/build.lock.txt -r /tmp/lock/${LOCK}.lock.txt \
    && rm -rf /tmp/lock

# 2. The built-in config.
COPY config/bot.local.yaml /etc/msmon/bot.yaml

# 3. msmon itself, from the build context (bind-mounted, not copied into a layer); its dependencies are above.
RUN --mount=type=bind,target=/src,rw \
    pip install --no-deps --no-build-isolation /src

USER msmon
WORKDIR /var/lib/msmon
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4).status == 200 else 1)"
CMD ["msmon", "serve", "--config", "/etc/msmon/bot.yaml", "--host", "0.0.0.0", "--port", "8080"]
