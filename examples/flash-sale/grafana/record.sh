#!/usr/bin/env bash
# A real run for the dashboard picture: the demo (its private redis-server and three shop
# instances on one SQLite database, locks on), a Prometheus that scrapes their /metrics every
# second, rounds of the load generator against all three for DURATION seconds, then
# render.py over that window into docs/dashboard.png (or OUT).
#
#   PYTHON=/tmp/venv/bin/python bash examples/flash-sale/grafana/record.sh
#
# Needs redis-server and prometheus on the PATH (Debian: apt-get install redis-server
# prometheus) and a Python with matplotlib (PYTHON). DURATION (240), OUT, PROFILE (debug or
# release; debug), CARGO_TARGET_DIR and KEEP (keep the logs and Prometheus's data) are read
# from the environment. Everything it starts listens on loopback only and is stopped on the
# way out.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
duration=${DURATION:-240}
out=${OUT:-$here/../docs/dashboard.png}
python=${PYTHON:-python3}
profile=${PROFILE:-debug}
target=${CARGO_TARGET_DIR:-$root/target}
work=$(mktemp -d /tmp/flash-sale-dashboard.XXXXXX)
demo_pid='' prometheus_pid=''

cleanup() {
    # The demo stops its instances and its redis-server on Ctrl-C (SIGINT); whatever of
    # them is still there a few seconds later is ended here.
    if [ -n "$demo_pid" ]; then
        children=$(pgrep -P "$demo_pid" || true)
        kill -INT "$demo_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$demo_pid" 2>/dev/null || break; sleep 0.1; done
        # shellcheck disable=SC2086 # one pid a word
        [ -z "$children" ] || kill $children 2>/dev/null || true
        kill "$demo_pid" 2>/dev/null || true
    fi
    if [ -n "$prometheus_pid" ]; then kill "$prometheus_pid" 2>/dev/null || true; fi
    wait 2>/dev/null || true
    if [ -n "${KEEP:-}" ]; then echo "record.sh: logs and data kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

"$python" -c 'import matplotlib' || {
    echo "record.sh: $python has no matplotlib (PYTHON=...)" >&2
    exit 2
}
command -v prometheus >/dev/null || {
    echo "record.sh: no prometheus on the PATH (apt-get install prometheus)" >&2
    exit 2
}

flag=()
[ "$profile" = release ] && flag=(--release)
(cd "$root" && cargo build --locked "${flag[@]}" -p flash-sale --bin demo --bin loadgen)
bin=$target/$profile

echo "record.sh: the demo (both rounds, then the shop stays up) …"
"$bin/demo" >"$work/demo.log" 2>&1 &
demo_pid=$!
for _ in $(seq 600); do
    grep -q 'Ctrl-C to stop' "$work/demo.log" && break
    kill -0 "$demo_pid" 2>/dev/null || { cat "$work/demo.log" >&2; exit 1; }
    sleep 0.5
done
mapfile -t urls < <(grep -oE '^  http://127\.0\.0\.1:[0-9]+' "$work/demo.log" | tr -d ' ')
[ "${#urls[@]}" -gt 0 ] || { cat "$work/demo.log" >&2; exit 1; }
echo "record.sh: instances ${urls[*]}"

port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
{
    echo "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}"
    echo "scrape_configs:"
    echo "  - job_name: flash-sale"
    echo "    static_configs:"
    echo "      - targets: [$(printf '"%s",' "${urls[@]#http://}" | sed 's/,$//')]"
} >"$work/prometheus.yml"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
    --web.listen-address="127.0.0.1:$port" --log.level=warn >"$work/prometheus.log" 2>&1 &
prometheus_pid=$!
for _ in $(seq 100); do
    curl -fsS "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1 && break
    sleep 0.2
done
echo "record.sh: Prometheus on 127.0.0.1:$port, load for ${duration}s …"

# A few seconds of idle first, so the panels start from the shop at rest; then rounds of
# buyers of varied size and concurrency, against all three instances or the first alone
# ("one:"), with idle pauses between some of them.
sleep 10
start=$(date +%s)
sleep 5
shapes=(
    "--users 1000 --concurrency 100"
    "--users 3000 --concurrency 300 --sku-stock 200"
    "--users 2000 --concurrency 200"
    "pause"
    "--users 2000 --concurrency 400 --requests 5"
    "one:--users 1500 --concurrency 100 --sku-stock 500"
    "pause"
)
deadline=$(($(date +%s) + duration))
round=0
while [ "$(date +%s)" -lt "$deadline" ]; do
    shape=${shapes[round % ${#shapes[@]}]}
    round=$((round + 1))
    if [ "$shape" = pause ]; then
        sleep 8
        continue
    fi
    targets=("${urls[@]}")
    case $shape in one:*) targets=("${urls[0]}") shape=${shape#one:} ;; esac
    # shellcheck disable=SC2086 # the shape is several arguments
    "$bin/loadgen" "${targets[@]}" $shape >"$work/loadgen.log" 2>&1 ||
        { echo "record.sh: loadgen $shape failed:" >&2; cat "$work/loadgen.log" >&2; }
done
sleep 30
end=$(date +%s)

"$python" "$here/render.py" --prometheus "http://127.0.0.1:$port" \
    --start "$start" --end "$end" --out "$out"
