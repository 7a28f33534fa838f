#!/usr/bin/env bash
# Makes sure what Nudge's tests and demo need is installed and running on this
# machine: PostgreSQL and RabbitMQ on loopback, the Mailpit binary, Node.js
# with npm, and Chromium.
# Idempotent and quick when everything is already there. Installing needs root
# (apt-get); starting uses the distribution's own service commands.
set -euo pipefail

log() { printf 'ensure-services: %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    log "need root for: $*"; return 1; fi
}

apt_updated=
apt_install() {
  if [ -z "$apt_updated" ]; then as_root apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

wait_for() { # name, tries, command...
  local name=$1 tries=$2; shift 2
  for _ in $(seq "$tries"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  log "$name did not come up"; return 1
}

pg_ready() { pg_isready -q -h 127.0.0.1 -p 5432; }
pg_query() { psql -h 127.0.0.1 -U postgres -d "$1" -Atqc "$2"; }

# PostgreSQL (trust auth for local connections, as on this machine kind).
if ! command -v pg_isready >/dev/null || ! pg_ready; then
  if ! command -v pg_ctlcluster >/dev/null; then
    log "installing PostgreSQL"
    apt_install postgresql
  fi
  version=$(ls /etc/postgresql | sort -n | tail -1)
  log "starting PostgreSQL $version"
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  wait_for PostgreSQL 30 pg_ready
fi
if ! pg_query postgres "select 1" >/dev/null 2>&1; then
  log "PostgreSQL does not accept user postgres without a password on 127.0.0.1;"
  log "set NUDGE_TEST_DATABASE_URL to a database you can use"
  exit 1
fi
if [ "$(pg_query postgres "select 1 from pg_database where datname = 'test'")" != 1 ]; then
  log "creating database test"
  pg_query postgres "create database test" >/dev/null
fi

# RabbitMQ.
rabbit_ready() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }
if ! rabbit_ready; then
  if ! command -v rabbitmq-server >/dev/null; then
    log "installing RabbitMQ"
    apt_install rabbitmq-server
  fi
  log "starting RabbitMQ"
  as_root rabbitmq-server -detached || true
  wait_for RabbitMQ 60 rabbit_ready
  # The port opens before the broker accepts work.
  as_root rabbitmqctl await_startup >/dev/null 2>&1 || true
fi

# Queues left behind by interrupted test runs (test topologies are prefixed
# t-, demo ones nudge-demo-). Each quorum queue holds file handles; a few
# hundred leaked ones exhaust the broker's handle budget (about 900 under the
# default ulimit) and it stops accepting connections. Only idle ones go.
if command -v rabbitmqctl >/dev/null; then
  leaked=$(as_root rabbitmqctl -q eval 'length([rabbit_amqqueue:delete(Q, false, false, <<"nudge-cleanup">>)
    || Q <- rabbit_amqqueue:list(<<"/">>),
       case amqqueue:get_name(Q) of
         {resource, _, queue, <<"t-", _/binary>>} -> true;
         {resource, _, queue, <<"nudge-demo-", _/binary>>} -> true;
         _ -> false
       end,
       rabbit_amqqueue:consumers(Q) =:= []]).' 2>/dev/null || echo "?")
  [ "$leaked" = 0 ] || log "removed $leaked leftover test queues from RabbitMQ"
fi

# The TLS tests (internal/tlstest) start servers of their own beside these:
# a PostgreSQL cluster (initdb, pg_ctl) and a RabbitMQ node with the EXTERNAL
# mechanism plugin. A distribution that split them out needs them installed.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  log "installing the PostgreSQL server binaries (initdb, pg_ctl)"
  apt_install postgresql
fi
if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ] ||
   ! ls /usr/lib/rabbitmq/lib/*/plugins/rabbitmq_auth_mechanism_ssl-* >/dev/null 2>&1; then
  log "installing RabbitMQ (its node script and plugins)"
  apt_install rabbitmq-server
fi

# Node.js and npm, for the application example in another language
# (examples/node, run by its Go test with `npm ci`).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  log "installing Node.js and npm"
  apt_install nodejs npm
fi

# Chromium (Debian's package), the headless browser of the console's
# end-to-end test (internal/console); apt_install runs apt-get update first.
if ! command -v chromium >/dev/null; then
  log "installing Chromium (the console's browser test)"
  apt_install chromium
fi

# Mailpit, the real SMTP server the tests deliver to.
gobin=$(go env GOBIN); [ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
if ! command -v mailpit >/dev/null && [ ! -x "$gobin/mailpit" ]; then
  log "installing Mailpit (a few minutes the first time)"
  GOFLAGS=-buildvcs=false go install github.com/axllent/mailpit@v1.33.1
fi
log "PostgreSQL, RabbitMQ, Mailpit, Node.js and Chromium are ready"
