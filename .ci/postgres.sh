#!/usr/bin/env bash
# Install (Debian's postgresql package) and start a local PostgreSQL server, and create the role and database
# that tests/test_arena_postgres.py uses. Idempotent; needs root.
set -euo pipefail
if ! command -v pg_lsclusters >/dev/null 2>&1; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql
fi
version=$(pg_lsclusters --no-header | awk 'NR==1 {print $1}')
if [ -z "$version" ]; then
    version=$(ls /usr/lib/postgresql | sort -n | tail -1)
    pg_createcluster "$version" main
fi
pg_ctlcluster "$version" main start 2>/dev/null || true
pg_ctlcluster "$version" main status >/dev/null
su postgres -c "psql -tAc \"SELECT 1 FROM pg_roles WHERE rolname='gradwise'\"" | grep -q 1 \
    || su postgres -c "psql -qc \"CREATE ROLE gradwise LOGIN PASSWORD 'gradwise'\""
su postgres -c "psql -tAc \"SELECT 1 FROM pg_database WHERE datname='gradwise_test'\"" | grep -q 1 \
    || su postgres -c "createdb -O gradwise gradwise_test"
echo "postgresql://gradwise:gradwise@localhost:5432/gradwise_test"
