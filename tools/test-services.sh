#!/usr/bin/env bash
# What the tests need beyond Python packages, installed when absent: a real Prometheus and Alertmanager
# (Debian packages) for tests/integration/test_prometheus.py and test_alertmanager.py. Quiet when all is
# there; where they cannot be installed their tests skip, saying why. `make test` runs this first.
set -euo pipefail
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
        --no-install-recommends "${missing[@]}"; } >/dev/null 2>&1 ||
        echo "tools/test-services.sh: could not install ${missing[*]}; their tests will be skipped" >&2
fi
