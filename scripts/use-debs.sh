#!/usr/bin/env bash
# Unpacks the packages scripts/fetch-debs.sh downloaded (DIR, default .debs/) into a private prefix
# (PREFIX, default .deps-root/; nothing outside it is touched), makes their pkg-config files point
# there, and prints the environment to build against them:  eval "$(scripts/use-debs.sh)"
# CMake then finds every dependency under the prefix first (CMAKE_PREFIX_PATH, PKG_CONFIG_PATH);
# the built programs find the shared libraries through their RPATH.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$root/.debs}"
prefix="${2:-$root/.deps-root}"
ls "$dir"/*.deb >/dev/null 2>&1 || { echo "use-debs: no .deb files in $dir (run scripts/fetch-debs.sh where apt works)" >&2; exit 1; }
mkdir -p "$prefix"
for f in "$dir"/*.deb; do dpkg-deb -x "$f" "$prefix"; done
arch_dir="$prefix/usr/lib/x86_64-linux-gnu"
# Debian's .pc files name /usr; point them at the prefix (CMake's config files are relocatable).
for pc in "$arch_dir"/pkgconfig/*.pc "$prefix"/usr/share/pkgconfig/*.pc; do
  [ -f "$pc" ] && sed -i -E "s#^([A-Za-z_]+)=/usr#\1=$prefix/usr#" "$pc"
done
echo "export CMAKE_PREFIX_PATH=\"$prefix/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}\""
echo "export PKG_CONFIG_PATH=\"$arch_dir/pkgconfig:$prefix/usr/share/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}\""
echo "export LD_LIBRARY_PATH=\"$arch_dir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
# No pkg-config on the machine: use the unpacked pkgconf (CMake's FindPkgConfig reads this variable).
if ! command -v pkg-config >/dev/null 2>&1; then
  echo "export PKG_CONFIG=\"$prefix/usr/bin/pkgconf\""
fi
