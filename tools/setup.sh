#!/bin/sh
# Installs the system packages fsdp-run needs to build and test (Debian/Ubuntu apt),
# skipping those already installed.
set -e
PKGS="build-essential pkg-config libyaml-dev libjansson-dev libgtest-dev libopenblas-dev \
libopenmpi-dev openmpi-bin zlib1g-dev libdeflate-dev patchelf libcairo2-dev libpcre2-dev libunistring-dev"
# clang + its runtime are needed only for `make fuzz`; install them when asked.
[ "${FSDP_SETUP_FUZZ:-0}" = 1 ] && PKGS="$PKGS clang libclang-rt-14-dev"
missing=""
for p in $PKGS; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
if [ -z "$missing" ]; then
  echo "setup: all system packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup: need root (or sudo) to install:$missing" >&2; exit 1; fi
fi
echo "setup: installing:$missing"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
