#!/usr/bin/env bash
# Builds shardlane's runtime image from scratch with buildah, for machines
# that reach no container registry: the binary (stripped), the shared
# libraries it links and the CA certificates (from this machine), and the
# same settings as the Containerfile's runtime stage.
#
#   packaging/container/build-scratch.sh <shardlane binary> [<image name>]
set -euo pipefail
# HEALTHCHECK exists in the docker image format only.
export BUILDAH_FORMAT=docker
bin="${1:?usage: build-scratch.sh <shardlane binary> [<image name>]}"
image="${2:-localhost/shardlane:scratch}"
for tool in buildah strip ldd; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found (Debian: buildah, binutils, libc-bin)" >&2; exit 1; }
done
work="$(mktemp -d)"
ctr=""
cleanup() {
    [[ -n "$ctr" ]] && buildah rm "$ctr" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

strip -o "$work/shardlane" "$bin"
mkdir -p "$work/root/var/lib/shardlane" "$work/root/var/cache/shardlane"
ctr="$(buildah from scratch)"
buildah copy --quiet "$ctr" "$work/shardlane" /usr/local/bin/shardlane
# The dynamic loader and every library the binary links, at their paths.
ldd "$bin" | awk '/=> \// { print $3 } /^[ \t]*\/lib/ { print $1 }' | sort -u | while read -r lib; do
    buildah copy --quiet "$ctr" "$lib" "$lib"
done
buildah copy --quiet --chown 65532:65532 "$ctr" "$work/root/" /
# The CA certificates (TLS to AWS and to allowed HTTP hosts), as the
# distroless base has them.
[[ -f /etc/ssl/certs/ca-certificates.crt ]] || { echo "error: /etc/ssl/certs/ca-certificates.crt not found (Debian: ca-certificates)" >&2; exit 1; }
buildah copy --quiet "$ctr" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
buildah config \
    --env XDG_CACHE_HOME=/var/cache \
    --workingdir /var/lib/shardlane \
    --user 65532:65532 \
    --volume /var/lib/shardlane \
    --volume /var/cache/shardlane \
    --port 9090 \
    --stop-signal SIGTERM \
    --healthcheck 'CMD /usr/local/bin/shardlane healthcheck' \
    --healthcheck-interval 10s \
    --healthcheck-timeout 5s \
    --healthcheck-start-period 60s \
    --entrypoint '["/usr/local/bin/shardlane"]' \
    --cmd '["run", "--config", "/etc/shardlane/shardlane.toml", "--log-format", "json"]' \
    "$ctr"
buildah commit --quiet --format docker "$ctr" "$image" >/dev/null
echo "$image"
