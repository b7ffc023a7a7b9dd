#!/bin/sh
# Start redis-server with the per-component ACL users of users.acl.template: the passwords come
# from the environment (a Kubernetes Secret / compose .env) and the rendered ACL file is written
# to a memory-backed directory, never to the image or the data volume.
# Usage: start.sh <acl-template> <rendered-acl-path> <redis.conf> [redis-server args...]
set -eu
template=$1; acl=$2; conf=$3; shift 3
for name in REDIS_INGEST_PASSWORD REDIS_INDEXER_PASSWORD REDIS_RECALL_PASSWORD REDIS_EXPORTER_PASSWORD; do
  eval "value=\${$name:-}"
  [ -n "$value" ] || { echo "start.sh: $name is not set" >&2; exit 2; }
  case $value in *[!A-Za-z0-9_-]*) echo "start.sh: $name may hold only A-Z a-z 0-9 _ -" >&2; exit 2;; esac
done
umask 077
sed -e "s/\${REDIS_INGEST_PASSWORD}/$REDIS_INGEST_PASSWORD/" \
    -e "s/\${REDIS_INDEXER_PASSWORD}/$REDIS_INDEXER_PASSWORD/" \
    -e "s/\${REDIS_RECALL_PASSWORD}/$REDIS_RECALL_PASSWORD/" \
    -e "s/\${REDIS_EXPORTER_PASSWORD}/$REDIS_EXPORTER_PASSWORD/" \
    -e '/^#/d' -e '/^$/d' "$template" > "$acl"
exec redis-server "$conf" --aclfile "$acl" "$@"
