#!/usr/bin/env bash
# Debian packages used by the end-to-end tests: real Prometheus/Alertmanager,
# docker-compose (to validate the compose file without an engine), stunnel (a TLS
# listener in front of the test broker) and Chromium (renders the HTML report headless
# and screenshots it). Skipped when present.
set -euo pipefail
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v amtool >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v stunnel4 >/dev/null 2>&1 || command -v stunnel >/dev/null 2>&1 || need+=(stunnel4)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-system-deps: missing ${need[*]} (run as root or install them; those tests will be skipped)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
