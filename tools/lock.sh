#!/usr/bin/env bash
# The image's lock files, with the hash of every file pip may download (requirements/*.lock.txt), resolved for the
# image's Python (3.11, Linux x86_64, glibc) from pyproject.toml. Run after changing a dependency or to take
# upgrades; needs uv (pip install uv) and PyPI:
#   tools/lock.sh                       # bot (the common set), all, and build (setuptools and wheel)
#   tools/lock.sh slack postgres        # one more lock for a set of extras: requirements/slack+postgres.lock.txt
# The Dockerfile installs one of them with `pip install --require-hashes --no-deps`: nothing is resolved in the
# build, and a file whose hash differs is refused.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-uv}
TARGET=(--generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 --annotation-style line)
lock() {  # lock NAME ARGS...
    local name=$1; shift
    "$UV" pip compile "$@" "${TARGET[@]}" --custom-compile-command "tools/lock.sh" -o "requirements/$name.lock.txt" \
        --quiet
}
if [ $# -gt 0 ]; then
    extras=(); for e in "$@"; do extras+=(--extra "$e"); done
    lock "$(IFS=+; echo "$*")" pyproject.toml "${extras[@]}"
    exit 0
fi
lock build requirements/build.in
lock bot pyproject.toml --extra bot
lock all pyproject.toml --extra all
