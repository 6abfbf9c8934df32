#!/usr/bin/env bash
# `make demo`: the main job end to end on one machine, every part on loopback only.
#   a local Ray cluster (ray start --head), an MLflow server (SQLite backend) and the sweep API;
#   the demo sweep (sweeps/examples/demo.yaml) submitted over HTTP and watched to the end; the
#   answer printed; the MLflow UI left running until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="$PWD/.venv/bin"
SPEC="${1:-sweeps/examples/demo.yaml}"

export SWEEPS_DATA_DIR="${SWEEPS_DATA_DIR:-$PWD/.batchsweep/demo}"
mkdir -p "$SWEEPS_DATA_DIR"
free_port() { "$BIN/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
RAY_PORT=$(free_port); DASH_PORT=$(free_port); MLFLOW_PORT=$(free_port); API_PORT=$(free_port)

# Ray on loopback only, token auth on (see README: Local Ray); Train V2 reports without a 2 s wait
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=0
export RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.1 RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S=120

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  "$BIN/ray" stop --force >/dev/null 2>&1 || true
}
trap cleanup EXIT INT TERM

wait_http() {  # URL, what
  for _ in $(seq 1 120); do
    if "$BIN/python" -c "import httpx,sys; sys.exit(0 if httpx.get('$1', timeout=2).status_code < 500 else 1)" 2>/dev/null; then return 0; fi
    sleep 1
  done
  echo "$2 did not come up at $1" >&2; exit 1
}

"$BIN/python" -c "import worker"  # creates ~/.ray/auth_token on a machine that has none
echo "== Ray cluster on 127.0.0.1:$RAY_PORT"
"$BIN/ray" start --head --port="$RAY_PORT" --node-ip-address=127.0.0.1 --dashboard-host=127.0.0.1 \
  --dashboard-port="$DASH_PORT" --disable-usage-stats >"$SWEEPS_DATA_DIR/ray-start.log" 2>&1
export RAY_ADDRESS="127.0.0.1:$RAY_PORT"

echo "== MLflow server on http://127.0.0.1:$MLFLOW_PORT"
"$BIN/mlflow" server --backend-store-uri "sqlite:///$SWEEPS_DATA_DIR/mlflow.db" \
  --artifacts-destination "$SWEEPS_DATA_DIR/mlartifacts" --host 127.0.0.1 --port "$MLFLOW_PORT" \
  --workers 1 >"$SWEEPS_DATA_DIR/mlflow.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$MLFLOW_PORT/health" "MLflow"
export MLFLOW_TRACKING_URI="http://127.0.0.1:$MLFLOW_PORT" MLFLOW_UI_URL="http://127.0.0.1:$MLFLOW_PORT"

TOKEN=$("$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(24))')
export SWEEPS_TOKENS="demo=$TOKEN" SWEEPS_URL="http://127.0.0.1:$API_PORT" SWEEPS_TOKEN="$TOKEN"
echo "== sweep API on $SWEEPS_URL (docs: $SWEEPS_URL/docs)"
"$BIN/sweeps" serve --host 127.0.0.1 --port "$API_PORT" >"$SWEEPS_DATA_DIR/api.log" 2>&1 &
pids+=($!)
wait_http "$SWEEPS_URL/healthz" "the sweep API"
echo "   bearer token for this demo: $TOKEN"

echo "== submitting $SPEC"
"$BIN/sweeps" submit "$SPEC" --watch

echo
echo "MLflow UI: $MLFLOW_UI_URL  (runs of each sweep under its experiment; figures under the summary run)"
echo "The API and the MLflow UI keep running until Ctrl-C."
wait "${pids[0]}"
