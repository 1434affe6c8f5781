#!/usr/bin/env bash
# Make sure the services the test suite talks to are up: Redis on 127.0.0.1:6379.
# A fresh machine may not have Redis at all, so install it from Debian's packages if needed.
set -euo pipefail
REDIS_PORT="${COMPACTD_TEST_REDIS_PORT:-6379}"

redis_up() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }

if redis_up; then exit 0; fi
if ! command -v redis-server >/dev/null 2>&1; then
  echo "ensure-services: installing redis-server" >&2
  export DEBIAN_FRONTEND=noninteractive
  (apt-get update -qq && apt-get install -y -qq redis-server) >/dev/null
fi
mkdir -p /tmp/compactd-redis
redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" \
  --appendonly no --dir /tmp/compactd-redis --logfile /tmp/compactd-redis/redis.log
for _ in $(seq 1 50); do redis_up && exit 0; sleep 0.1; done
echo "ensure-services: redis did not come up on port $REDIS_PORT" >&2
exit 1
