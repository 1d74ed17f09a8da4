#!/usr/bin/env bash
# Makes a Python base image for deploy/Dockerfile from Debian's archive alone, for machines that reach no container
# registry (the test suite's image test uses it), and keeps it in podman's image store: made once, then reused.
#
#   deploy/python-base-image.sh [--suite SUITE] [--name NAME] [--mirror MIRROR]... [--rebuild]
#
# Prints the image's reference (NAME:SUITE-KEY) on stdout, everything else on stderr, so that:
#
#   podman build --format docker --build-arg PYTHON_IMAGE="$(deploy/python-base-image.sh)" -f deploy/Dockerfile .
#
# The root filesystem is made by `mmdebstrap --variant=minbase` with Debian's python3 (and python3-venv,
# python-is-python3 for `python`, libpython3-dev for the C module's headers, ca-certificates, passwd for useradd),
# then `podman import`ed. SUITE defaults to the machine's own release; the packages come from the machine's own apt
# sources for that suite (its -updates and -security too), or from each --mirror given (a URL, a "deb ..." line or a
# sources file, as mmdebstrap reads them). KEY is a hash of the suite, the packages, the sources and this script:
# when one of them changes, a new image is made; --rebuild makes it again anyway (for the archive's newer packages).
# Needs root, podman, and mmdebstrap when the image is not there yet (Debian packages podman, runc, mmdebstrap).
set -euo pipefail
suite=""
name="localhost/deprecation-gateway-python"
rebuild=0
mirrors=()
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) suite="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --mirror) mirrors+=("$2"); shift 2 ;;
    --rebuild) rebuild=1; shift ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "python-base-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
die() { echo "python-base-image: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap and podman's system image store)"
command -v podman >/dev/null 2>&1 || die "podman is not installed (Debian package podman)"
if [ -z "$suite" ]; then
  suite="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
  [ -n "$suite" ] || die "this machine names no Debian release in /etc/os-release: pass --suite"
fi
packages="python3,python3-venv,python-is-python3,libpython3-dev,ca-certificates,passwd"

work="$(mktemp -d -t python-base-image.XXXXXX)"
trap 'rm -rf "$work"' EXIT

# The machine's own entries for the suite, its -updates and its -security (other repositories, such as a vendor's,
# stay out: the image would not have their keys).
if [ ${#mirrors[@]} -eq 0 ]; then
  shopt -s nullglob
  for file in /etc/apt/sources.list.d/*.sources; do
    awk -v suite="$suite" 'BEGIN { RS = ""; ORS = "\n\n" }
      {
        keep = 0; enabled = 1
        n = split($0, lines, "\n")
        for (i = 1; i <= n; i++) {
          if (lines[i] ~ /^[Ee]nabled:[ \t]*no/) enabled = 0
          if (lines[i] ~ /^[Ss]uites:/) {
            m = split(lines[i], words, /[ \t]+/)
            for (j = 2; j <= m; j++) if (words[j] ~ ("^" suite "(-updates|-security)?$")) keep = 1
          }
        }
        if (keep && enabled) print
      }' "$file" >> "$work/machine.sources"
  done
  for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$file" ] || continue
    awk -v suite="$suite" '$1 == "deb" {
        k = 2; if ($k ~ /^\[/) { while ($k !~ /\]$/) k++; k++ }
        if ($(k + 1) ~ ("^" suite "(-updates|-security)?$")) print
      }' "$file" >> "$work/machine.list"
  done
  for file in "$work/machine.sources" "$work/machine.list"; do
    [ -s "$file" ] && mirrors+=("$file")
  done
  [ ${#mirrors[@]} -gt 0 ] || die "no apt source for $suite in /etc/apt: pass --mirror (for example http://deb.debian.org/debian)"
fi

key="$({
  echo "$suite $packages"
  for mirror in "${mirrors[@]}"; do if [ -f "$mirror" ]; then cat "$mirror"; else echo "$mirror"; fi; done
  cat "${BASH_SOURCE[0]}"
} | sha256sum | cut -c1-12)"
ref="$name:$suite-$key"

# One maker at a time on the machine (podman's image store is the machine's); a second caller waits and then finds
# the image. The lock is the machine's too, not the caller's TMPDIR.
lockdir=/run/lock
[ -d "$lockdir" ] && [ -w "$lockdir" ] || lockdir=/tmp
exec 9>"$lockdir/deprecation-gateway-python-base-image.lock"
flock 9
if [ "$rebuild" = 0 ] && podman image exists "$ref"; then
  echo "$ref"
  exit 0
fi
command -v mmdebstrap >/dev/null 2>&1 || die "mmdebstrap is not installed (Debian package mmdebstrap)"
echo "python-base-image: making $ref from Debian's $suite (mmdebstrap, about a minute)" >&2
# No manual pages, documentation (but copyright files) or translations: a smaller image, and the exclusions stay in
# force for what the Dockerfile installs on top.
mmdebstrap --variant=minbase --format=tar --include="$packages" \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  "$suite" "$work/rootfs.tar" "${mirrors[@]}" >&2
podman import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
  --message "Debian $suite minbase with python3 (deploy/python-base-image.sh)" "$work/rootfs.tar" "$ref" >&2
# Earlier images of this name (other keys) are not needed any more; one still in use by a container stays.
podman images --noheading --format '{{.Repository}}:{{.Tag}}' "$name" | grep -vxF "$ref" \
  | xargs -r podman rmi >/dev/null 2>&1 || true
echo "$ref"
