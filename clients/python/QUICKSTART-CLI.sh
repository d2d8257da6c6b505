# The README's quick start with the command line instead of curl (for the lead to move into
# README.md, after the curl block). In the clone, with the broker of "Run it" running; bash -e.
.venv/bin/pip install -q standardwebhooks==1.1.0 ./clients/python
wb() { .venv/bin/webhook-broker "$@"; }
export WEBHOOK_BROKER_URL=http://127.0.0.1:8000 WEBHOOK_BROKER_TOKEN=$(cat .broker-admin-token)
export WEBHOOK_BROKER_CHANNEL_TOKEN=ct WEBHOOK_BROKER_PRODUCER_ID=shop WEBHOOK_BROKER_PRODUCER_TOKEN=pt
# wait_for MESSAGE CONSUMER STATUS: until that consumer's job for MESSAGE has STATUS, 30 tries a
# second apart; then it says where to look, shows the message with its jobs and fails
wait_for() {
  tries=0
  until wb --json messages get orders "$1" | .venv/bin/python -c 'import json, sys
sys.exit(not any(job["ListenerName"] == sys.argv[1] and job["Status"] == sys.argv[2]
                 for job in json.load(sys.stdin)["Jobs"]))' "$2" "$3"; do
    tries=$((tries + 1))
    if [ "$tries" -ge 30 ]; then
      echo "gave up after 30 s: expected $2's job for $1 to be $3. See the dispatcher's lines in" \
        "runbroker's output (first terminal), and the jobs' Status and LastError:" >&2
      wb messages get orders "$1" >&2
      return 1
    fi
    sleep 1
  done
}
wb channels put orders --token ct
wb producers put shop --token pt
wb consumers put orders billing --callback-url http://127.0.0.1:9000/hook --token kt --retry-delays 1,1
wb consumers put orders warehouse --callback-url http://127.0.0.1:9000/unused --type pull --token wt
export WEBHOOK_SECRET=$(wb consumers secret orders billing)
.venv/bin/python docs/examples/receiver.py --port 9000 & RECEIVER=$!
# Publish: the receiver prints "verified webhook {...}"
wb publish orders --id order-42 --content-type application/json --data '{"order": 42}'
wait_for order-42 billing DELIVERED
# Pull: the warehouse's worker claims its job and acknowledges it
wb pull orders warehouse --consumer-token wt --ack
# Failure: with the receiver stopped, the next message's job goes to the dead-letter queue
kill $RECEIVER
wb publish orders --id order-43 --content-type application/json --data '{"order": 43}'
wait_for order-43 billing DEAD
wb dlq list orders billing
# Repair: start the receiver again and requeue the dead job; the receiver prints order 43
.venv/bin/python docs/examples/receiver.py --port 9000 & RECEIVER=$!
wb dlq requeue orders billing --yes
wait_for order-43 billing DELIVERED
wb status
