#!/bin/sh
# Regenerates every file in this directory: real first records from real clients on loopback,
# then the synthetic cases. Each capture line below is exactly how that file was produced.
#
#   cargo build -p ingress-tests --bin capture-clienthello
#   tests/data/clienthello/capture.sh "$CARGO_TARGET_DIR/debug/capture-clienthello"
#
# Clients never reach a network: curl resolves through --resolve, openssl connects to 127.0.0.1,
# Chromium maps every name to 127.0.0.1. The listener closes after the first record, so every
# client ends in a handshake error; that is expected and ignored.
set -eu

TOOL=${1:?usage: capture.sh <path to capture-clienthello>}
DIR=$(cd "$(dirname "$0")" && pwd)
PORT=${PORT:-47443}

# cap <file> <client command...>: capture the first record the client sends to 127.0.0.1:$PORT.
cap() {
    out=$1
    shift
    "$TOOL" listen "127.0.0.1:$PORT" "$DIR/$out" &
    listener=$!
    sleep 0.5
    timeout 30 "$@" </dev/null >/dev/null 2>&1 || true
    wait "$listener"
}

CURL="curl -sk --max-time 10 --resolve curl.example.test:$PORT:127.0.0.1 https://curl.example.test:$PORT/"
cap curl-tls13.bin $CURL
cap curl-tls12-max.bin $CURL --tls-max 1.2
cap curl-http2.bin $CURL --http2
cap curl-http1.1.bin $CURL --http1.1

S_CLIENT="openssl s_client -connect 127.0.0.1:$PORT"
cap openssl-tls13-sni.bin $S_CLIENT -servername openssl.example.test
cap openssl-tls13-nosni.bin $S_CLIENT -noservername
cap openssl-tls12-sni.bin $S_CLIENT -tls1_2 -servername openssl.example.test
cap openssl-tls12-nosni.bin $S_CLIENT -tls1_2 -noservername
cap openssl-alpn-h2.bin $S_CLIENT -servername Alpn.Example.Test -alpn h2,http/1.1

# Chromium shuffles its extensions per connection, so three captures put server_name at
# different offsets of a ~2 KB post-quantum hello.
for i in 1 2 3; do
    profile=$(mktemp -d)
    cap "chromium-$i.bin" chromium --headless --no-sandbox --disable-gpu --disable-quic \
        --no-first-run --disable-background-networking --disable-component-update --disable-sync \
        --user-data-dir="$profile" --host-resolver-rules="MAP * 127.0.0.1" --dump-dom \
        "https://chromium.example.test:$PORT/"
    rm -rf "$profile"
done

"$TOOL" synth "$DIR"
