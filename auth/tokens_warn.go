package auth

// UnboundWriters names the tokens that may remote-write without being bound
// to a cluster: whoever holds one can write series for any cluster of its
// tenant. Clusters should hold authorize-only fleet tokens. Push does not
// count: a push carries an _id only when its credential is bound to one.
func (t *Tokens) UnboundWriters() []string {
	return t.names(func(id Identity) bool { return id.Allow&PermWrite != 0 && id.ClusterID == "" })
}

// ExchangeOnly names the tokens that may authorize but not write: fleet
// tokens, which write through the cluster credential they are exchanged
// for at /authorize, or on Telemeter's /metrics/v1/receive.
func (t *Tokens) ExchangeOnly() []string {
	return t.names(func(id Identity) bool { return id.Allow&PermAuthorize != 0 && id.Allow&PermWrite == 0 })
}

// names lists the names of the tokens whose identity match accepts.
func (t *Tokens) names(match func(Identity) bool) []string {
	var out []string
	for _, e := range t.entries {
		if match(e.id) {
			out = append(out, e.name)
		}
	}
	return out
}
