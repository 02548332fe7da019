// Package buildversion is the version both binaries report: the image's
// VERSION build argument (prometheus/common's version.Version, set with
// -ldflags -X), or Base for a build that names none.
package buildversion

import (
	"strings"

	"github.com/prometheus/common/version"
)

// Base is the version of a build that names none (go build, VERSION=dev).
const Base = "0.1.0"

// Of returns the version a build that was given v reports.
func Of(v string) string {
	if v == "" || v == "dev" {
		return Base
	}
	return strings.TrimPrefix(v, "v")
}

// Set makes version.Version the build's version, so that --version, the
// build_info metric and /api/v1/status/buildinfo show it rather than an
// empty string. Call it before any of those reads it (a main's init).
func Set() { version.Version = Of(version.Version) }
