#!/usr/bin/env bash
# What the tests need beyond Python packages, installed or started when absent; `make test` runs this first.
#   - Debian's Prometheus and Alertmanager (tests/bot/test_metrics_prometheus.py, tests/bot/receivers/alertmanager/);
#   - Debian's Chromium for the web console's browser tests (Playwright drives /usr/bin/chromium);
#   - PostgreSQL (the shared store) and NATS with JetStream (the fleet transport) on loopback, started
#     with the machine's own commands when they are installed but down.
# Quiet when all is there; where something cannot be installed or started its tests skip, saying why.
set -uo pipefail
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo -n"

missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
[ -x /usr/bin/chromium ] || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
        --no-install-recommends "${missing[@]}"; } >/dev/null 2>&1 ||
        echo "tools/test-services.sh: could not install ${missing[*]}; their tests will be skipped" >&2
fi

# PostgreSQL: the cluster this machine runs (trust auth on loopback).
if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -q -h 127.0.0.1 -p 5432; then
    if [ -d /etc/postgresql ]; then
        $sudo pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start >/dev/null 2>&1 ||
            echo "tools/test-services.sh: PostgreSQL is down and did not start; its tests will be skipped" >&2
    fi
fi

# NATS with JetStream.
nats_up() { (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null; }
if ! nats_up && [ -x /usr/sbin/nats-server ]; then
    $sudo mkdir -p /var/lib/nats-server
    $sudo start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
        -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log >/dev/null 2>&1
    for _ in 1 2 3 4 5 6 7 8 9 10; do nats_up && break; sleep 0.5; done
    nats_up || echo "tools/test-services.sh: NATS is down and did not start; its tests will be skipped" >&2
fi
exit 0
