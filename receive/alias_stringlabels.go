//go:build !slicelabels && !dedupelabels

package receive

import "unsafe"

// aliasString returns b as a string without copying; see v1Request.
func aliasString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
