#!/usr/bin/env bash
# Builds upstream Konnectivity v0.36.0 (`proxy-server`, `proxy-agent`) from
# the Go module proxy into OUTDIR, for konn-bench's side-by-side runs.
#
#   bench/upstream/build.sh OUTDIR
#
# The versions are pinned by go.mod/go.sum next to this script (the `tool`
# directive names the two commands; konnectivity-client is required at
# v0.36.0 explicitly because upstream's own `replace` of it is ignored when
# the module is a dependency — the released binaries were built with the
# client of the same tag). Needs Go >= 1.26 on PATH or in /usr/local/go/bin.
# Skips the build when both binaries are newer than go.sum.
set -euo pipefail
out="${1:?usage: $0 OUTDIR}"
here="$(cd "$(dirname "$0")" && pwd)"
export PATH="$PATH:/usr/local/go/bin" GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
command -v go >/dev/null || { echo "Go is not installed (need >= 1.26)" >&2; exit 1; }
mkdir -p "$out"
if [ "$out/proxy-server" -nt "$here/go.sum" ] && [ "$out/proxy-agent" -nt "$here/go.sum" ]; then
  exit 0
fi
cd "$here"
go build -o "$out/proxy-server" sigs.k8s.io/apiserver-network-proxy/cmd/server
go build -o "$out/proxy-agent" sigs.k8s.io/apiserver-network-proxy/cmd/agent
