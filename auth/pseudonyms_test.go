package auth

import (
	"context"
	"crypto/ed25519"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestRefusePseudonyms: under RefusePseudonyms an id sent with the
// pseudonym's shape is refused before the fleet authorizer is asked (400 at
// /authorize, 401 on Telemeter's write path), so no client can present a
// stored id; a raw id is still hashed and accepted.
func TestRefusePseudonyms(t *testing.T) {
	h, err := NewClusterIDHasher([]byte("0123456789abcdef-fleet-key"))
	require.NoError(t, err)
	h.RefusePseudonyms = true
	const raw = "0f8d2c1e-5a6b-4c3d-9e8f-7a6b5c4d3e2f"
	stored := h.Pseudonym(raw)
	var asked []ClusterIDs
	fleet := fleetFunc(func(_ context.Context, _ string, cluster ClusterIDs) (string, error) {
		asked = append(asked, cluster)
		return "acme", nil
	})

	t.Run("/authorize", func(t *testing.T) {
		asked = nil
		iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": newKey(t)}, "k"), time.Hour, nil)
		iss.Hasher = h
		ah := NewAuthorizeHandler(discardLogger(), nil, fleet, iss)
		post := func(id string) *httptest.ResponseRecorder {
			rec := httptest.NewRecorder()
			ah.ServeHTTP(rec, bearer(httptest.NewRequest(http.MethodPost, "/authorize?id="+id, nil), "fleet"))
			return rec
		}
		rec := post(stored)
		require.Equal(t, http.StatusBadRequest, rec.Code)
		require.Contains(t, rec.Body.String(), "pseudonyms: refuse")
		require.Equal(t, 1.0, testutil.ToFloat64(ah.results.WithLabelValues("invalid")))
		require.Empty(t, asked, "refused before the authorizer is asked")

		rec = post(raw)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		require.Equal(t, []ClusterIDs{{Sent: raw, Stored: stored}}, asked)
	})
	t.Run("/metrics/v1/receive", func(t *testing.T) {
		asked = nil
		a := NewTelemeterBearer(nil, fleet, TelemeterOptions{Hasher: h})
		_, err := a.Authenticate(bearerReq(telemeterBearer("fleet", stored)))
		require.ErrorIs(t, err, ErrUnauthorized)
		require.ErrorContains(t, err, "pseudonyms: refuse")
		require.Equal(t, http.StatusUnauthorized, RejectStatus(err))
		require.Equal(t, 1.0, testutil.ToFloat64(a.checks.WithLabelValues("invalid")))
		require.Empty(t, asked, "refused before the authorizer is asked")

		id, err := a.Authenticate(bearerReq(telemeterBearer("fleet", raw)))
		require.NoError(t, err)
		require.Equal(t, stored, id.ClusterID)
		require.Equal(t, []ClusterIDs{{Sent: raw, Stored: stored}}, asked)
	})
}
