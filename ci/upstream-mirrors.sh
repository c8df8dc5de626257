#!/usr/bin/env bash
# Writable mirrors of the upstream trees in ../shared/upstream, and a git configuration that sends each real
# upstream URL to its mirror (url.<mirror>.insteadOf=<URL>), as a site with an internal mirror has. trainbox
# itself knows nothing of mirrors: `trainbox fetch` / `image build` run the user's git with its configuration.
#
#   export GIT_CONFIG_GLOBAL="$(bash ci/upstream-mirrors.sh [UPSTREAM_DIR] [DEST_DIR])"
#
# UPSTREAM_DIR (default ../shared/upstream) holds bare repositories and a README.md whose table names each one's
# upstream URL. They are read-only and lack the empty refs/ git needs, hence the copies in DEST_DIR (default
# build/mirrors, made once). Prints the path of the configuration file, which also includes ~/.gitconfig.
set -euo pipefail
cd "$(dirname "$0")/.."

src=$(realpath "${1:-../shared/upstream}")
dest=$(realpath -m "${2:-build/mirrors}")
[ -f "$src/README.md" ] || { echo "upstream-mirrors: $src/README.md: not found (expected the shared upstream trees)" >&2; exit 2; }
mkdir -p "$dest"
config="$dest/gitconfig"
tmp=$(mktemp "$dest/.gitconfig.XXXXXX")
trap 'rm -f "$tmp"' EXIT
printf '# written by ci/upstream-mirrors.sh from %s\n[include]\n\tpath = ~/.gitconfig\n' "$src" >"$tmp"

# README rows: | NAME.git | https://... | ...  (later rows of the same repository leave the URL empty)
count=0
while IFS='|' read -r _ repo url _; do
  repo=$(echo "$repo" | xargs) url=$(echo "$url" | xargs)
  case "$repo" in *.git) ;; *) continue ;; esac
  [ -n "$url" ] || continue
  [ -d "$src/$repo" ] || { echo "upstream-mirrors: $src/$repo: listed in README.md but missing" >&2; exit 2; }
  if [ ! -d "$dest/$repo/refs" ]; then
    rm -rf "$dest/$repo.part"
    cp -r "$src/$repo" "$dest/$repo.part"
    chmod -R u+w "$dest/$repo.part"
    mkdir -p "$dest/$repo.part/refs"
    mv "$dest/$repo.part" "$dest/$repo"
  fi
  printf '[url "file://%s/%s"]\n\tinsteadOf = %s\n' "$dest" "$repo" "$url" >>"$tmp"
  count=$((count + 1))
done <"$src/README.md"
[ "$count" -gt 0 ] || { echo "upstream-mirrors: $src/README.md: no '| NAME.git | URL |' rows" >&2; exit 2; }
mv "$tmp" "$config"
trap - EXIT
echo "upstream-mirrors: $count mirrors in $dest" >&2
echo "$config"
