#!/usr/bin/env bash
# Makes the services the tests use reachable: PostgreSQL on 127.0.0.1:5432 (trust auth,
# database `test`) and RabbitMQ on 127.0.0.1:5672 (guest/guest). Running ones are used as they
# are. Where none answers, the Debian packages are installed when missing and a private instance
# is started with its data under /tmp/abserve-services (it keeps running after this script).
set -euo pipefail
base=/tmp/abserve-services
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo

answers() { (echo > "/dev/tcp/127.0.0.1/$1") >/dev/null 2>&1; }
# run as the postgres user (initdb refuses root)
as_postgres() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi; }

apt_install() {
  echo "services: installing $*" >&2
  $sudo apt-get update -qq
  # the packages' own service start is not wanted (and fails without an init system)
  printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
  $sudo chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
  $sudo rm -f /usr/sbin/policy-rc.d
}

postgres() {
  if answers 5432; then
    echo "services: PostgreSQL answers on 127.0.0.1:5432"
  else
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || apt_install postgresql
    bin=$(dirname "$(ls -d /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")
    data=$base/postgres
    $sudo mkdir -p "$base" && $sudo chmod 1777 "$base"
    if [ ! -f "$data/PG_VERSION" ]; then
      $sudo rm -rf "$data" && $sudo install -d -o postgres -g postgres "$data"
      as_postgres "$bin/initdb" -D "$data" -A trust -U postgres >/dev/null
    fi
    as_postgres "$bin/pg_ctl" -D "$data" -l "$base/postgres.log" -w \
      -o "-c listen_addresses=127.0.0.1 -c port=5432 -k $data" start >/dev/null
    echo "services: started a private PostgreSQL on 127.0.0.1:5432 (data $data)"
  fi
  if ! psql -h 127.0.0.1 -U postgres -d test -c 'select 1' >/dev/null 2>&1; then
    psql -h 127.0.0.1 -U postgres -d postgres -c 'CREATE DATABASE test' >/dev/null
  fi
}

rabbitmq() {
  if answers 5672; then
    echo "services: RabbitMQ answers on 127.0.0.1:5672"
    return
  fi
  command -v rabbitmq-server >/dev/null 2>&1 || apt_install rabbitmq-server
  $sudo mkdir -p "$base" && $sudo chmod 1777 "$base"
  # Debian's rabbitmq-server runs as the rabbitmq user: it owns its data
  if id rabbitmq >/dev/null 2>&1; then
    $sudo install -d -o rabbitmq -g rabbitmq "$base/rabbitmq"
  else
    mkdir -p "$base/rabbitmq"
  fi
  # the node name of rabbitmq-env.conf (or the default), so that a plain `rabbitmqctl` reaches it
  $sudo env RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=5672 \
    RABBITMQ_MNESIA_BASE="$base/rabbitmq/mnesia" RABBITMQ_LOG_BASE="$base/rabbitmq/log" \
    sh -c 'cd /tmp && exec rabbitmq-server -detached'
  for _ in $(seq 1 60); do
    answers 5672 && break
    sleep 1
  done
  answers 5672 || { echo "services: RabbitMQ did not start; see $base/rabbitmq/log" >&2; exit 1; }
  $sudo rabbitmqctl await_startup >/dev/null
  echo "services: started a private RabbitMQ on 127.0.0.1:5672 (data $base/rabbitmq)"
}

postgres
rabbitmq
