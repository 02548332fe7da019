#!/usr/bin/env bash
# Installs the Thanos release the e2e tests check the bucket against
# (e2e/thanos_test.go) into $(go env GOPATH)/bin/thanos, unless that version
# is there. `go install thanos@version` refuses Thanos' module (its go.mod
# has replace directives), so this builds from the module's source, which
# the Go module proxy serves: no other download. 4–6 minutes on 2 cores (less with the modules cached).
set -euo pipefail
version="${THANOS_VERSION:-0.41.0}" # the newest release Go 1.26.8 builds (0.42 needs 1.26.10)
dest="$(go env GOPATH)/bin"
# Thanos' own builds use these tags: without slicelabels its zero-copy label
# conversions read Prometheus' default labels wrongly (the Store Gateway
# crashes on its first sync).
tags="netgo slicelabels"
if have="$("$dest/thanos" --version 2>&1)" && grep -q "version $version " <<<"$have" && grep -q "tags: *${tags// /,}$" <<<"$have"; then
  exit 0
fi
src="$(go mod download -json "github.com/thanos-io/thanos@v$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -d "$src" ] || { echo "install-thanos: no source for thanos v$version" >&2; exit 1; }
work="$(mktemp -d)"
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
cp -r "$src/." "$work"
chmod -R u+w "$work"
mkdir -p "$dest"
(cd "$work" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -trimpath -tags "$tags" \
  -ldflags "-X github.com/prometheus/common/version.Version=$version" \
  -o "$dest/thanos" ./cmd/thanos)
"$dest/thanos" --version 2>&1 | head -1
