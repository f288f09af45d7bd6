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

# suffix | partitions | co-partitioned with the tables (count must match) | config.
# The checkers create the same topics when they are missing; creating them here
# first avoids replicas racing for it and sets retention.  window-ticks is the
# checkers' internal timer topic.
TOPICS=(
  "events|${PARTITIONS}|yes|retention.ms=${EVENTS_RETENTION_MS}"
  "step-summaries|${PARTITIONS}|yes|retention.ms=${EVENTS_RETENTION_MS}"
  "window-ticks|${PARTITIONS}|yes|retention.ms=${EVENTS_RETENTION_MS}"
  "violations|${PARTITIONS}|no|"
  "dead-letter|1|no|"
)

status=0
for entry in "${TOPICS[@]}"; do
  IFS='|' read -r suffix partitions copartitioned config <<<"$entry"
  topic="${PREFIX}${suffix}"
  args=(--bootstrap-server "$BOOTSTRAP" --create --if-not-exists
        --topic "$topic" --partitions "$partitions" --replication-factor 1)
  if [ -n "$config" ]; then
    args+=(--config "$config")
  fi
  "$KAFKA_TOPICS" "${args[@]}"
  described="$("$KAFKA_TOPICS" --bootstrap-server "$BOOTSTRAP" --describe --topic "$topic")"
  actual="$(printf '%s\n' "$described" | sed -n 's/.*PartitionCount:[[:space:]]*\([0-9][0-9]*\).*/\1/p' | head -n 1)"
  if [ "$copartitioned" = yes ] && [ "$actual" != "$partitions" ]; then
    echo "create-topics: topic $topic has ${actual:-unknown} partitions, expected $partitions;" \
         "set TRAINWATCH_PARTITIONS=${actual:-?} for every checker or recreate the topic" >&2
    status=1
  else
    echo "create-topics: $topic ready (${actual:-?} partitions)"
  fi
done
exit "$status"
