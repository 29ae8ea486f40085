#!/bin/sh
# Install the Debian packages of tools/debian-packages.txt whose program is missing (as root, with
# `apt-get update` first); otherwise name exactly what to run. One list, so nothing the suite calls
# can be installed by hand and forgotten. An argument names another list (tools/interop/debian-packages.txt).
here=$(dirname "$0")
missing=""
while read -r pkg prog; do
  case "$pkg" in ''|'#'*) continue ;; esac
  found=""
  case "$prog" in /*) [ -e "$prog" ] && found=1 ;; esac  # a package with no program: a file it installs
  for p in "$prog" "/usr/sbin/$prog" "/usr/bin/$prog" "/usr/local/sbin/$prog"; do
    if command -v "$p" >/dev/null 2>&1; then found=1; break; fi
  done
  [ -n "$found" ] || missing="$missing $pkg"
done < "${1:-$here/debian-packages.txt}"
[ -n "$missing" ] || exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian packages:$missing" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null || exit 1
  exit 0
fi
echo "missing Debian packages:$missing. Run: sudo apt-get update && sudo apt-get install -y$missing" >&2
exit 1
