#!/usr/bin/env bash
# Creates trainwatch's topics before any checker starts.
#
# Why a one-shot script instead of broker auto-creation: the checkers' Faust tables
# are co-partitioned with the events topic, so the events topic must exist with
# exactly TRAINWATCH_PARTITIONS partitions before the first worker joins.  An
# existing topic with a different count is reported, never silently altered
# (shrinking is impossible and growing moves run:step keys between partitions).
set -euo pipefail

BOOTSTRAP="${KAFKA_BOOTSTRAP:-kafka:19092}"
PREFIX="${TRAINWATCH_TOPIC_PREFIX:-trainwatch.}"
PARTITIONS="${TRAINWATCH_PARTITIONS:-8}"
EVENTS_RETENTION_MS="${TRAINWATCH_EVENTS_RETENTION_MS:-259200000}"
KAFKA_TOPICS="${KAFKA_TOPICS_BIN:-/opt/kafka/bin/kafka-topics.sh}"

if ! [[ "$PARTITIONS" =~ ^[1-9][0-9]*$ ]]; then
  echo "create-topics: TRAINWATCH_PARTITIONS must be a positive integer, got '$PARTITIONS'" >&2
  exit 2
fi
if ! [[ "$EVENTS_RETENTION_MS" =~ ^-?[0-9]+$ ]]; then
  echo "create-topics: TRAINWATCH_EVENTS_RETENTION_MS must be an integer, got '$EVENTS_RETENTION_MS'" >&2
  exit 2
fi

# topic suffix | extra topic configs
TOPICS=(
  "events|retention.ms=${EVENTS_RETENTION_MS}"
  "violations|"
  "step-summaries|retention.ms=${EVENTS_RETENTION_MS}"
  "dead-letter|"
)

status=0
for entry in "${TOPICS[@]}"; do
  topic="${PREFIX}${entry%%|*}"
  config="${entry#*|}"
  args=(--bootstrap-server "$BOOTSTRAP" --create --if-not-exists
        --topic "$topic" --partitions "$PARTITIONS" --replication-factor 1)
  if [ -n "$config" ]; then
    args+=(--config "$config")
  fi
  "$KAFKA_TOPICS" "${args[@]}"
  described="$("$KAFKA_TOPICS" --bootstrap-server "$BOOTSTRAP" --describe --topic "$topic")"
  actual="$(printf '%s\n' "$described" | sed -n 's/.*PartitionCount:[[:space:]]*\([0-9][0-9]*\).*/\1/p' | head -n 1)"
  if [ "$actual" != "$PARTITIONS" ]; then
    echo "create-topics: topic $topic has ${actual:-unknown} partitions, expected $PARTITIONS;" \
         "start the checkers with TRAINWATCH_PARTITIONS=${actual:-?} or recreate the topic" >&2
    status=1
  else
    echo "create-topics: $topic ready ($PARTITIONS partitions)"
  fi
done
exit "$status"
