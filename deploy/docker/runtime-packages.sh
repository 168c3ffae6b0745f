#!/bin/sh
# Prints the Debian packages whose shared libraries the given binaries load (per ldd), one per
# line, sorted. Used by the Dockerfiles' build stage to install exactly those in the runtime stage
# (same Debian release, so the names match), and by scripts/check-deploy on the binaries of a local
# build. Fails on a library ldd cannot find or no package owns. The NVIDIA driver's libraries
# (libcuda, libnvidia-*) are skipped: the NVIDIA container toolkit mounts them from the host.
# So are libraries of a CUDA toolkit installed under /usr/local/cuda* (NVIDIA's installer, as on
# the development machines), which no Debian package owns; they are named on stderr. The CUDA
# image builds against Debian's nvidia-cuda-toolkit instead, whose runtime libraries are packages.
#   deploy/docker/runtime-packages.sh BINARY...
set -eu
[ "$#" -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
status=0
libs=$(for bin in "$@"; do ldd "$bin"; done)
missing=$(printf '%s\n' "$libs" | awk '/not found/ {print $1}' \
  | grep -v -e '^libcuda\.so' -e '^libnvidia-' || true)
if [ -n "$missing" ]; then
  echo "runtime-packages: libraries not found: $missing" >&2
  status=1
fi
pkgs=""
for lib in $(printf '%s\n' "$libs" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u); do
  case "$(basename "$lib")" in libcuda.so*|libnvidia-*) continue ;; esac
  real=$(readlink -f "$lib")
  case "$real" in
    /usr/local/cuda*)
      echo "runtime-packages: $lib is from the CUDA toolkit in /usr/local, not a Debian package" >&2
      continue ;;
  esac
  pkg=""
  # Merged /usr: ldd may report /lib/... while dpkg registered /usr/lib/... (or the reverse).
  for path in "$lib" "$real" "/usr$lib" "/usr$real" "${lib#/usr}" "${real#/usr}"; do
    pkg=$(dpkg-query -S "$path" 2>/dev/null | grep -v '^diversion' | head -n1 | cut -d: -f1) || true
    [ -n "$pkg" ] && break
  done
  if [ -z "$pkg" ]; then
    echo "runtime-packages: no Debian package owns $lib" >&2
    status=1
    continue
  fi
  pkgs="$pkgs$pkg
"
done
printf '%s' "$pkgs" | sort -u
exit $status
