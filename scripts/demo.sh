#!/usr/bin/env bash
# make demo: the system on its embedded default, on this machine.
#   fixture server (one synthetic cluster) → Prometheus (scrapes it)
#   → forwarder (federates the allowlist, anonymizes, queues on disk)
#   → receiver (tokens, TSDB with WAL, filesystem bucket) → query API.
# Everything listens on 127.0.0.1 and stops on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin}
DIR=${DEMO_DIR:-data/demo}
RECEIVER_ADDR=${RECEIVER_ADDR:-127.0.0.1:9291}
PROM_ADDR=${PROM_ADDR:-127.0.0.1:9098}
FIXTURE_ADDR=${FIXTURE_ADDR:-127.0.0.1:9099}
FORWARDER_ADDR=${FORWARDER_ADDR:-127.0.0.1:9002}
INTERVAL=${INTERVAL:-30s}

PROMETHEUS=$(command -v prometheus || true)
if [ -z "$PROMETHEUS" ]; then
  echo "demo: Debian's prometheus is needed as the federation source: apt-get install -y prometheus" >&2
  exit 1
fi

# Before anything is removed or started: a demo still running (or any
# other server) on one of the addresses would answer the readiness checks
# below for a process that could not listen.
for addr in "$RECEIVER_ADDR" "$PROM_ADDR" "$FIXTURE_ADDR" "$FORWARDER_ADDR"; do
  if (exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}") 2>/dev/null; then
    echo "demo: something already listens on $addr (a demo still running?); stop it, or set RECEIVER_ADDR, PROM_ADDR, FIXTURE_ADDR or FORWARDER_ADDR" >&2
    exit 1
  fi
done

rm -rf "$DIR" && mkdir -p "$DIR"
rand() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
WRITE_TOKEN=$(rand)
READ_TOKEN=$(rand)
printf '%s' "$WRITE_TOKEN" > "$DIR/write-token"
printf '%s' "$(rand)" > "$DIR/salt"
cat > "$DIR/tokens.yaml" <<YAML
tokens:
  - token_sha256: $(printf '%s' "$WRITE_TOKEN" | sha256sum | cut -d' ' -f1)
    tenant: demo
    allow: [write]
  - token_sha256: $(printf '%s' "$READ_TOKEN" | sha256sum | cut -d' ' -f1)
    tenant: demo
    allow: [read]
YAML
cat > "$DIR/receiver.yaml" <<YAML
auth:
  tokens_file: tokens.yaml
storage:
  external_labels: {replica: demo-0}
YAML
cat > "$DIR/prometheus.yml" <<YAML
global: {scrape_interval: 15s}
scrape_configs:
  - job_name: cluster
    honor_labels: true
    honor_timestamps: false
    static_configs: [{targets: ['$FIXTURE_ADDR']}]
YAML

pids=()
stop() {
  trap - INT TERM EXIT
  echo; echo "demo: stopping (the receiver flushes its head and uploads a block)..."
  for ((i=${#pids[@]}-1; i>=0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; wait "${pids[i]}" 2>/dev/null || true; done
  echo "demo: blocks in the bucket: $(ls "$DIR/receiver/bucket" 2>/dev/null | wc -l) ($DIR/receiver/bucket)"
}
trap stop INT TERM EXIT

wait_ready() { # url, name, log: the last process started
  local pid=${pids[-1]}
  for _ in $(seq 1 120); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "demo: $2 exited at start; the end of $3:" >&2
      tail -n 5 "$3" >&2
      exit 1
    fi
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.5
  done
  echo "demo: $2 did not become ready; logs in $DIR/*.log" >&2
  exit 1
}

"$BIN/receiver" --config.file="$DIR/receiver.yaml" --storage.path="$DIR/receiver" \
  --web.listen-address="$RECEIVER_ADDR" --log.format=logfmt 2>"$DIR/receiver.log" & pids+=($!)
wait_ready "http://$RECEIVER_ADDR/-/ready" receiver "$DIR/receiver.log"

# Built, not `go run`: stop() signals the server itself (go run would leave it behind on SIGTERM).
go build -o "$BIN/fixtureserver" ./bench/cmd/fixtureserver
"$BIN/fixtureserver" --listen="$FIXTURE_ADDR" 2>"$DIR/fixture.log" & pids+=($!)
"$PROMETHEUS" --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/prometheus" \
  --web.listen-address="$PROM_ADDR" 2>"$DIR/prometheus.log" & pids+=($!)
wait_ready "http://$PROM_ADDR/-/ready" prometheus "$DIR/prometheus.log"

"$BIN/forwarder" --from="http://$PROM_ADDR" --to="http://$RECEIVER_ADDR" --to-token-file="$DIR/write-token" \
  --id=demo-cluster-5f6c2a9e --anonymize-salt-file="$DIR/salt" --match-file=bench/testdata/telemetry-allowlist.txt \
  --interval="$INTERVAL" --listen="$FORWARDER_ADDR" --queue.dir="$DIR/queue" --log.format=logfmt 2>"$DIR/forwarder.log" & pids+=($!)
wait_ready "http://$FORWARDER_ADDR/readyz" forwarder "$DIR/forwarder.log"

cat <<TXT

phonehome demo is running (logs in $DIR/*.log).
  receiver   http://$RECEIVER_ADDR   (self-metrics: /metrics, bucket: $DIR/receiver/bucket)
  forwarder  http://$FORWARDER_ADDR/metrics, federating http://$PROM_ADDR every $INTERVAL
  read token $READ_TOKEN

The first forward cycle lands within ~$INTERVAL. Then query the fleet:
  curl -s -H 'Authorization: Bearer $READ_TOKEN' 'http://$RECEIVER_ADDR/api/v1/query?query=count(csv_succeeded)'
  curl -s -H 'Authorization: Bearer $READ_TOKEN' 'http://$RECEIVER_ADDR/api/v1/label/_id/values'
Fleet status page: http://$RECEIVER_ADDR/ (sign in with the read token).
Grafana: a Prometheus data source at http://$RECEIVER_ADDR with header Authorization: Bearer $READ_TOKEN.
Ctrl-C stops everything cleanly (make then reports the interrupt).
TXT
wait "${pids[0]}"
