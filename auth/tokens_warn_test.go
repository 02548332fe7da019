package auth

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTokenWarningsName: UnboundWriters and ExchangeOnly name tokens by
// index and name, never by the token; a push-only token is no writer.
func TestTokenWarningsName(t *testing.T) {
	tok, err := NewTokens([]TokenEntry{
		{Token: "s-fleet", Tenant: "acme", Allow: []string{"authorize"}, Name: "fleet"},
		{Token: "s-push", Tenant: "acme", Allow: []string{"push"}, Name: "installer"},
		{Token: "s-all", Tenant: "acme"},
		{Token: "s-bound", Tenant: "acme", ClusterID: "c1"},
	})
	require.NoError(t, err)
	require.Equal(t, []string{"tokens[2]"}, tok.UnboundWriters(), "push writes no cluster's series; a bound token only its own")
	require.Equal(t, []string{`tokens[0] ("fleet")`}, tok.ExchangeOnly())
}
