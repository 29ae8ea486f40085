#!/bin/sh
# What `make interop` needs, kept out of the main venv: Debian's brokers (tools/interop/debian-packages.txt),
# amqtt in .venv-interop, aedes and MQTT.js in build/interop/node_modules. Versions pinned here.
set -e
here=$(dirname "$0")
root=$(cd "$here/../.." && pwd)
sh "$root/tools/ensure_debian.sh" "$here/debian-packages.txt"
if [ ! -x "$root/.venv-interop/bin/amqtt" ]; then
  python3 -m venv "$root/.venv-interop"
  "$root/.venv-interop/bin/pip" install -q amqtt==0.12.1
fi
mkdir -p "$root/build/interop"
if [ ! -d "$root/build/interop/node_modules/aedes" ] || [ ! -d "$root/build/interop/node_modules/mqtt" ]; then
  # a package.json of its own: without one npm installs into the nearest folder above that has one (the
  # repository's root, whose package.json is the mip manifest)
  [ -f "$root/build/interop/package.json" ] || echo '{"private": true}' > "$root/build/interop/package.json"
  (cd "$root/build/interop" && npm install --no-audit --no-fund --silent aedes@1.2.0 mqtt@5.16.0)
fi
