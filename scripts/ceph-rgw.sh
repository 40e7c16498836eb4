#!/usr/bin/env bash
# A one-node Ceph cluster with its S3 gateway on loopback, for gpufeed's remote benchmark: one
# monitor, one BlueStore OSD on a sparse file, the RADOS Gateway on 127.0.0.1, no auth between
# daemons. Debian's packages (root): apt-get install ceph-mon ceph-osd radosgw ceph-common.
#
#   scripts/ceph-rgw.sh start [DIR] [PORT]   # S3 on http://127.0.0.1:PORT (7480), bucket gpufeed
#   scripts/ceph-rgw.sh env [DIR] [PORT]     # the AWS_* lines to eval for gpufeed / aws CLIs
#   scripts/ceph-rgw.sh put FILE... s3://gpufeed/PREFIX/   # uploads (curl's SigV4; GPUFEED_S3_PORT)
#   scripts/ceph-rgw.sh stop [DIR]           # stops the daemons; the cluster stays in DIR
#   scripts/ceph-rgw.sh destroy [DIR]        # stops and removes DIR
#
# Credentials: access key and secret "gpufeed". The OSD's block file is sparse (20 GiB at most).
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-start}
key=gpufeed
if [ "$cmd" != put ]; then
    dir=${2:-target/ceph}
    port=${3:-7480}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    conf=$dir/ceph.conf
    for b in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph-authtool ceph; do
        if ! command -v "$b" >/dev/null; then
            echo "$b not found: apt-get install ceph-mon ceph-osd radosgw ceph-common" >&2
            exit 2
        fi
    done
fi

write_conf() {
    local fsid=$1
    cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$((port - 7480 + 3300)),v1:127.0.0.1:$((port - 7480 + 6789))]
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
# With auth none, the gateway's messenger finds no "secure" mode to offer the monitor: crc.
ms mon client mode = crc
ms client mode = crc
ms mon service mode = crc
ms service mode = crc
ms cluster mode = crc
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv4 = true
ms bind ipv6 = false
run dir = $dir/run
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.pid
keyring = $dir/keyring
[mon]
mon data = $dir/mon/\$cluster-\$id
[osd]
osd data = $dir/osd/\$cluster-\$id
osd objectstore = bluestore
bluestore block create = true
bluestore block size = 21474836480
osd memory target = 1073741824
bluestore cache autotune = false
bluestore cache size = 268435456
[client.rgw.gw]
rgw frontends = beast endpoint=127.0.0.1:$port
rgw data = $dir/rgw
EOF
}

pids() { cat "$dir"/run/*.pid 2>/dev/null || true; }

case "$cmd" in
start)
    if [ -f "$dir/run/client.rgw.gw.pid" ] && kill -0 "$(cat "$dir/run/client.rgw.gw.pid")" 2>/dev/null; then
        echo "already running"; exit 0
    fi
    mkdir -p "$dir/run" "$dir/log" "$dir/rgw"
    t0=$(date +%s.%N)
    if [ ! -f "$conf" ]; then
        fsid=$(cat /proc/sys/kernel/random/uuid)
        write_conf "$fsid"
        ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
        monmaptool --create --fsid "$fsid" --addv a \
            "[v2:127.0.0.1:$((port - 7480 + 3300)),v1:127.0.0.1:$((port - 7480 + 6789))]" \
            "$dir/monmap" >/dev/null
        mkdir -p "$dir/mon/ceph-a" "$dir/osd/ceph-0"
        ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring"
        ceph-mon -c "$conf" -i a
        uuid=$(cat /proc/sys/kernel/random/uuid)
        id=$(ceph -c "$conf" osd new "$uuid")
        ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$uuid" 2>>"$dir/log/mkfs.log"
        ceph-osd -c "$conf" -i "$id"
    else
        ceph-mon -c "$conf" -i a
        ceph-osd -c "$conf" -i 0
    fi
    for _ in $(seq 1 600); do
        if ceph -c "$conf" osd stat -f json 2>/dev/null | grep -q '"num_up_osds":1'; then break; fi
        sleep 0.1
    done
    radosgw -c "$conf" -n client.rgw.gw
    for _ in $(seq 1 600); do
        if curl -s -o /dev/null "http://127.0.0.1:$port/"; then break; fi
        sleep 0.1
    done
    if ! radosgw-admin -c "$conf" user info --uid "$key" >/dev/null 2>&1; then
        radosgw-admin -c "$conf" user create --uid "$key" --display-name "$key" \
            --access-key "$key" --secret "$key" >/dev/null
    fi
    # RGW wants the payload hash header that curl's SigV4 does not add by itself.
    curl -sf --aws-sigv4 "aws:amz:us-east-1:s3" --user "$key:$key" -X PUT \
        -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "http://127.0.0.1:$port/gpufeed" -o /dev/null ||
        true
    t1=$(date +%s.%N)
    echo "S3 (Ceph RGW) on http://127.0.0.1:$port (bucket gpufeed, key $key) in $(echo "$t1 - $t0" | bc) s; logs $dir/log"
    ;;
env)
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
            -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
            "http://127.0.0.1:${GPUFEED_S3_PORT:-7480}/${base%/}/$(basename "$f")"
    done
    ;;
stop | destroy)
    for p in $(pids); do kill "$p" 2>/dev/null || true; done
    for _ in $(seq 1 100); do
        alive=0
        for p in $(pids); do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    rm -f "$dir"/run/*.pid
    if [ "$cmd" = destroy ]; then rm -rf "$dir"; fi
    ;;
*)
    echo "usage: $0 start|env|put|stop|destroy [DIR] [PORT]" >&2
    exit 2
    ;;
esac
