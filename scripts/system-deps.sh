#!/usr/bin/env bash
# Debian packages the tests and chapters use: nginx (chapter 6), chromium + chromium-driver
# (the browser tests), curl, redis-server (chapter 13's shared log), openssl (chapter 14), nftables
# (chapter 5's reader whose network vanishes, inside a network namespace of its own), and a
# colour emoji font (fonts-noto-color-emoji: without one, the page and the book draw chapter 1's
# emoji as boxes). Installs only what is missing, and only where it can (root or
# password-less sudo); elsewhere it says what to install and the tests that need it skip.
set -euo pipefail

need=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v openssl >/dev/null 2>&1 || need+=(openssl)  # chapter 14's certificate for nginx's TLS and HTTP/2
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || need+=(nftables)
if command -v dpkg-query >/dev/null 2>&1; then  # Debian's font by its package; other systems bring their own emoji
  dpkg-query -W -f '${Status}' fonts-noto-color-emoji 2>/dev/null | grep -q "ok installed" || need+=(fonts-noto-color-emoji)
fi
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "streamlab: missing Debian packages: ${need[*]} (install them with apt-get; tests that need them will skip)" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "streamlab: no apt-get here; install ${need[*]} yourself (tests that need them will skip)" >&2
  exit 0
fi

echo "streamlab: installing ${need[*]} with apt-get" >&2
# Never let a package start its service: nginx's default site would listen on
# every address on port 80. Our tests start their own nginx on 127.0.0.1.
policy=/usr/sbin/policy-rc.d
restore=""
if [ ! -e "$policy" ] || ! grep -q "exit 101" "$policy"; then
  [ -e "$policy" ] && { "${sudo[@]}" cp "$policy" "$policy.streamlab-saved"; restore=saved; } || restore=remove
  printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
  "${sudo[@]}" chmod +x "$policy"
fi
cleanup() {
  case "$restore" in
    saved) "${sudo[@]}" mv "$policy.streamlab-saved" "$policy" ;;
    remove) "${sudo[@]}" rm -f "$policy" ;;
  esac
}
trap cleanup EXIT
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Belt and braces: if a service started anyway, stop it.
if pgrep -x nginx >/dev/null 2>&1 && [ -f /run/nginx.pid ]; then
  "${sudo[@]}" nginx -s stop 2>/dev/null || true
fi
if [ -f /run/redis/redis-server.pid ] && command -v service >/dev/null 2>&1; then
  "${sudo[@]}" service redis-server stop 2>/dev/null || true  # ours start on free ports, with their own folders
fi
