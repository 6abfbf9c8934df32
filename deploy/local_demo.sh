#!/usr/bin/env bash
# `make demo`: the main job end to end on embedded defaults, every part on loopback only.
#   `sweeps serve` exactly as the README runs it (no RAY_ADDRESS: the service starts its own local
#   Ray head; SQLite stores in the data dir), the demo sweep (sweeps/examples/demo.yaml) submitted
#   over HTTP and watched to the end, the answer printed, and an MLflow UI on the same store left
#   running until Ctrl-C (BATCHSWEEP_DEMO_EXIT=1: stop as soon as the answer is printed).
#   It prints one URL to open: a one-time sign-in link (POST /login/once) to the service's pages,
#   where the sweep runs live, its dashboard and its MLflow runs are one click away.
# On exit it stops what it started, by process id: the service, the MLflow UI and the service's Ray
# head (`sweeps stop-head` for this data dir). Other Ray clusters on the machine are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="$PWD/.venv/bin"
SPEC="${1:-sweeps/examples/demo.yaml}"

# the data dir and all the demo writes there (the MLflow UI's store, logs, the service's) are this user's alone
umask 077
export SWEEPS_DATA_DIR="${SWEEPS_DATA_DIR:-$PWD/.batchsweep/demo}"
mkdir -p "$SWEEPS_DATA_DIR"
chmod 700 "$SWEEPS_DATA_DIR"
unset RAY_ADDRESS MLFLOW_TRACKING_URI SWEEPS_OPTUNA_STORAGE SWEEPS_DATABASE_URL  # the embedded defaults
free_port() { "$BIN/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
API_PORT=$(free_port); MLFLOW_PORT=$(free_port)

pids=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do
    kill -TERM -- "-$pid" 2>/dev/null || true  # each was started as the leader of its own process group
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
  "$BIN/sweeps" stop-head --data-dir "$SWEEPS_DATA_DIR" || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_http() {  # URL, what, pid
  for _ in $(seq 1 180); do
    if "$BIN/python" -c "import httpx,sys; sys.exit(0 if httpx.get('$1', timeout=2).status_code < 500 else 1)" 2>/dev/null; then return 0; fi
    kill -0 "$3" 2>/dev/null || { echo "$2 exited; see its log in $SWEEPS_DATA_DIR" >&2; exit 1; }
    sleep 1
  done
  echo "$2 did not come up at $1" >&2; exit 1
}

# the MLflow UI reads the store the sweeps write (links from the service point at it)
echo "== MLflow UI on http://127.0.0.1:$MLFLOW_PORT"
setsid "$BIN/mlflow" server --backend-store-uri "sqlite:///$SWEEPS_DATA_DIR/mlflow.db" \
  --artifacts-destination "$SWEEPS_DATA_DIR/mlartifacts" --host 127.0.0.1 --port "$MLFLOW_PORT" \
  --workers 1 >"$SWEEPS_DATA_DIR/mlflow.log" 2>&1 &
pids+=($!)
export MLFLOW_UI_URL="http://127.0.0.1:$MLFLOW_PORT"

TOKEN=$("$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(24))')
export SWEEPS_TOKENS="demo=$TOKEN" SWEEPS_URL="http://127.0.0.1:$API_PORT" SWEEPS_TOKEN="$TOKEN"
echo "== sweep API on $SWEEPS_URL (docs: $SWEEPS_URL/docs), its Ray head in $SWEEPS_DATA_DIR/ray"
setsid "$BIN/sweeps" serve --host 127.0.0.1 --port "$API_PORT" >"$SWEEPS_DATA_DIR/api.log" 2>&1 &
pids+=($!)
wait_http "$SWEEPS_URL/healthz" "the sweep API" "${pids[1]}"
wait_http "$MLFLOW_UI_URL/health" "MLflow" "${pids[0]}"
echo "   bearer token for this demo: $TOKEN"
# one URL for the browser: it signs the demo user in once (valid for SWEEPS_SIGN_IN_LINK_TTL_S, 10 min)
LINK=$("$BIN/python" -c 'import httpx, os; r = httpx.post(os.environ["SWEEPS_URL"] + "/login/once", headers={"Authorization": "Bearer " + os.environ["SWEEPS_TOKEN"]}, timeout=30); r.raise_for_status(); print(r.json()["url"])')
echo
echo "== open in your browser and press Sign in (a one-time link; the sweep shows up there as it runs):"
echo "   $LINK"
echo

echo "== submitting $SPEC"
"$BIN/sweeps" submit "$SPEC" --watch

echo
echo "MLflow UI: $MLFLOW_UI_URL  (runs of each sweep under its experiment; figures under the summary run)"
if [ "${BATCHSWEEP_DEMO_EXIT:-0}" = 1 ]; then exit 0; fi
echo "The API and the MLflow UI keep running until Ctrl-C; the Ray head stops with them."
wait "${pids[1]}"
