#!/bin/sh
# Install Debian's mosquitto when it is missing (as root); otherwise say exactly what to run.
for p in mosquitto /usr/sbin/mosquitto /usr/local/sbin/mosquitto; do
  if command -v "$p" >/dev/null 2>&1; then exit 0; fi
done
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "mosquitto missing: installing Debian's package" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto >/dev/null || exit 1
  exit 0
fi
echo "mosquitto (the reference broker) is not installed. Run: sudo apt-get update && sudo apt-get install -y mosquitto" >&2
exit 1
