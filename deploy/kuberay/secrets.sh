#!/usr/bin/env bash
# Prints, as YAML, the Secrets of warmd's KubeRay deployment, each with fresh random values:
#
#   bash deploy/kuberay/secrets.sh | kubectl create -f -
#
# `kubectl create` refuses a Secret that exists, so running it again never rotates a live one
# (to rotate: delete them, create anew, restart the Redis pod and the RayCluster).
#   warmd-redis-acl         users.acl: deploy/redis/users.acl, each user given a random
#                           password, stored as its SHA-256 (`#<hex>`): the Redis StatefulSet
#                           (deploy/kuberay/redis.yaml) loads it as its aclfile
#   warmd-redis             url: the writer's URL (WARMD_REDIS_URL of the RayCluster's pods)
#   warmd-redis-reader      url: the reader's URL, for consumers that must never publish
#   warmd-signing-key       key: 32 random bytes, hex (signing_key_file /etc/warmd-key/key):
#                           every node signs what it publishes and refuses what is unsigned
# Needs only coreutils. Nothing is written to disk.
set -euo pipefail
cd "$(dirname "$0")/../.."

NAMESPACE=warmd
HOST=redis.$NAMESPACE.svc:6379   # the Service in deploy/kuberay/redis.yaml

random_hex() { head -c 32 /dev/urandom | od -An -v -tx1 | tr -d ' \n'; }
sha256() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }

writer=$(random_hex)
reader=$(random_hex)
key=$(random_hex)

secret() {  # name, key, value as YAML
  printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: %s\n' \
    "$1" "$NAMESPACE"
  printf 'type: Opaque\nstringData:\n  %s: %s\n' "$2" "$3"
}

acl=$(sed -e "s/^user warmd-writer on resetpass /&#$(sha256 "$writer") /" \
          -e "s/^user warmd-reader on resetpass /&#$(sha256 "$reader") /" \
          deploy/redis/users.acl)
# hex and URL characters only: safe inside double quotes; the ACL file as a block
secret warmd-redis-acl users.acl "|
$(printf '%s\n' "$acl" | sed 's/^/    /')"
secret warmd-redis url "\"redis://warmd-writer:$writer@$HOST/0\""
secret warmd-redis-reader url "\"redis://warmd-reader:$reader@$HOST/0\""
secret warmd-signing-key key "\"$key\""
