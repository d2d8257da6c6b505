#!/usr/bin/env bash
# Time a new user's first run: clone this checkout, paste the README's run command, then its quick
# start; prints the seconds to a server answering, to the first verified webhook, and to the end
# of the quick start (docs/performance.md). Needs ports 8000 and 9000 free.
set -Eeuo pipefail
source_checkout=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
stop_all() {  # the process groups this script started (the receiver runs in the quick start's)
    for group in ${quick_start:-} ${server:-}; do kill -- -"$group" 2>/dev/null || true; done
    sleep 3
    rm -rf "$work"
}
trap stop_all EXIT

readme_block() {  # the ```sh block after <!-- $1 --> in the README
    awk -v marker="<!-- $1 -->" '$0 == marker {f = 1; next} f && /^```sh/ {i = 1; next}
        i && /^```/ {exit} i {print}' README.md
}
since() { echo "$(date +%s.%N) - $started" | bc; }

started=$(date +%s.%N)
git clone -q "$source_checkout" "$work/clone" && cd "$work/clone"
setsid bash -c "$(readme_block run-command)" >run.log 2>&1 &
server=$!
until curl -fsS localhost:8000/_status >/dev/null 2>&1; do sleep 0.2; done
answering=$(since)
setsid bash -e -o pipefail -c "$(readme_block quick-start)" >quick-start.log 2>&1 &
quick_start=$!
until grep -qs '"id": "order-42"' quick-start.log; do sleep 0.2; done
first_webhook=$(since)
wait "$quick_start"
until grep -qs '"id": "order-43"' quick-start.log; do sleep 0.2; done
echo "server answering ${answering} s; first verified webhook ${first_webhook} s; quick start done $(since) s"
