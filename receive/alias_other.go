//go:build slicelabels || dedupelabels

package receive

// aliasString copies: with these label implementations TSDB keeps the
// strings it is given (see v1Request).
func aliasString(b []byte) string { return string(b) }
