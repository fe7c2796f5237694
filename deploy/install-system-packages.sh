#!/usr/bin/env bash
# Installs the Debian packages the project needs beyond its Python ones, for `make test` and `.ci/run`
# alike (one list, so the two never disagree):
#
#   libpostgresql-jdbc-java  /usr/share/java/postgresql.jar, the JDBC driver Spark reads the ledgers with
#   openjdk-17-jre-headless  java, for Spark (the reconciliation and its tests)
#   strace                   injects fsync failures into a store node (tests/raft_store/test_fsync_failure.py)
#   prometheus               promtool, the alert rules' unit tests (tests/deploy/test_monitoring.py)
#   chromium                 /usr/bin/chromium, the review pages' browser tests (Playwright drives it)
#   faketime                 a process on a skewed clock (the clock-skew tests)
#   openssl                  the certificates of the store's TLS tests (tests/raft_store/test_auth.py) and
#                            deploy/make-secrets
#
# Only what is missing is installed: with apt-get as root, or through sudo when it needs no password.
# Anyone else gets one line saying which command installs it; the tests that need a missing package
# then fail, each saying which package it needs (never a skip).
#
# Usage: deploy/install-system-packages.sh [--check]   (--check: install nothing, only say what is missing)
# Exit status: 0 when everything is there (afterwards), 1 when something is still missing.
set -uo pipefail

check_only=false
case "${1:-}" in
    "") ;;
    --check) check_only=true ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

missing=()
[ -f /usr/share/java/postgresql.jar ] || missing+=(libpostgresql-jdbc-java)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v strace >/dev/null 2>&1 || missing+=(strace)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
[ -x "${COMPENSATOR_CHROMIUM:-/usr/bin/chromium}" ] || missing+=(chromium)
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)

if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi

install=(apt-get install -y -qq "${missing[@]}")
if $check_only; then
    sudo=()
elif [ "$(id -u)" -eq 0 ]; then
    sudo=(env)
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n env)
else
    sudo=()
fi
if [ ${#sudo[@]} -eq 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "missing system packages: ${missing[*]}; install them with: sudo apt-get install -y ${missing[*]}" \
         "(or run: sudo $0); until then the tests that need them fail, naming the package" >&2
    exit 1
fi

echo "installing system packages: ${missing[*]}" >&2
if ! "${sudo[@]}" DEBIAN_FRONTEND=noninteractive apt-get update -qq \
        || ! "${sudo[@]}" DEBIAN_FRONTEND=noninteractive "${install[@]}" >/dev/null; then
    echo "could not install: ${missing[*]} (apt-get failed; see above)" >&2
    exit 1
fi
