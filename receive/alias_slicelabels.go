//go:build slicelabels

package receive

// aliasString copies: with slicelabels TSDB keeps the strings it is given
// (see v1Request).
func aliasString(b []byte) string { return string(b) }
