//go:build !slicelabels

package receive

import "unsafe"

// aliasString returns b as a string without copying; see v1Request. Both
// stringlabels (the default) and dedupelabels copy every string they keep:
// ScratchBuilder.Labels into one new string, SymbolTable.ToNum with
// strings.Clone.
func aliasString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
