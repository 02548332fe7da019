package auth

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Run calls OnChange once a reload put a changed file in force (not for
// an invalid one): the receiver then warns about the new tokens as it did
// about those it started with.
func TestFileTokensRunCallsOnChange(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tokens.yaml")
	write := func(s string) { // whole, as Run may read it at any moment
		require.NoError(t, os.WriteFile(p+".tmp", []byte(s), 0o600))
		require.NoError(t, os.Rename(p+".tmp", p))
	}
	write("tokens:\n- {token: a, tenant: t}\n")
	ft, err := NewFileTokens(discardLogger(), nil, p)
	require.NoError(t, err)
	changed := make(chan struct{}, 10)
	ft.OnChange = func() { changed <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ft.Run(ctx, time.Millisecond) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	write("tokens: [{tenant: t}]\n") // invalid: kept, no call
	write("tokens:\n- {token: b, tenant: t, allow: [write]}\n")
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no OnChange after the file changed")
	}
	require.Equal(t, []string{"tokens[0]"}, ft.UnboundWriters(), "the new file is in force when OnChange runs")
}

// Reload, as SIGHUP and POST /-/reload call it, calls OnChange too when it
// put a changed file in force, and not for an unchanged or invalid one.
func TestFileTokensReloadCallsOnChange(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tokens.yaml")
	require.NoError(t, os.WriteFile(p, []byte("tokens:\n- {token: a, tenant: t}\n"), 0o600))
	ft, err := NewFileTokens(discardLogger(), nil, p)
	require.NoError(t, err)
	changed := 0
	ft.OnChange = func() { changed++ }

	require.NoError(t, ft.Reload())
	require.NoError(t, os.WriteFile(p, []byte("tokens: [{tenant: t}]\n"), 0o600))
	require.Error(t, ft.Reload())
	require.Zero(t, changed, "unchanged, then invalid: no change")
	require.NoError(t, os.WriteFile(p, []byte("tokens:\n- {token: b, tenant: t, allow: [write]}\n"), 0o600))
	require.NoError(t, ft.Reload())
	require.Equal(t, 1, changed)
	require.Equal(t, []string{"tokens[0]"}, ft.UnboundWriters(), "the new file is in force when OnChange runs")
}
