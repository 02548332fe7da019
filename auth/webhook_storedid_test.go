package auth

import (
	"crypto/ed25519"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// webhookRequest is the body the receiver POSTs to an authorize webhook.
type webhookRequest struct {
	Token     string `json:"token"`
	ClusterID string `json:"cluster_id"`
	StoredID  string `json:"stored_id"`
}

// firstUseRegistry is an authorize webhook that approves ids it has not
// seen and binds each to the token that first asked for it, by stored_id,
// as the webhook contract asks of such a service. It records every request.
type firstUseRegistry struct {
	mu     sync.Mutex
	owners map[string]string // stored id -> token
	asked  []webhookRequest
}

func (f *firstUseRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var in webhookRequest
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, in)
	if owner, ok := f.owners[in.StoredID]; ok && owner != in.Token {
		w.WriteHeader(http.StatusForbidden)
		return
	}
	f.owners[in.StoredID] = in.Token
	_, _ = w.Write([]byte(`{"tenant":"acme"}`))
}

func (f *firstUseRegistry) last() webhookRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked[len(f.asked)-1]
}

// TestWebhookIsAskedTheStoredID: with cluster_id_hash, the webhook is told
// the id a credential binds (stored_id) next to the id as sent: a raw id's
// pseudonym, or a pseudonym-shaped id as it is. So a registry that binds on
// first use refuses a client that sends another cluster's stored id, which
// anyone who reads fleet data knows, at /authorize and on Telemeter's
// write path alike.
func TestWebhookIsAskedTheStoredID(t *testing.T) {
	h, err := NewClusterIDHasher([]byte("0123456789abcdef-fleet-key"))
	require.NoError(t, err)
	const raw = "0f8d2c1e-5a6b-4c3d-9e8f-7a6b5c4d3e2f"
	stolen := h.Pseudonym(raw)                    // the victim's _id, as readers of fleet data see it
	forwarder := h.Pseudonym("hashed-in-cluster") // any 22-character pseudonym a forwarder sends

	paths := map[string]func(fleet FleetAuthorizer) func(token, id string) int{
		"/authorize": func(fleet FleetAuthorizer) func(token, id string) int {
			iss := NewIssuer(NewKeySet(map[string]ed25519.PrivateKey{"k": newKey(t)}, "k"), time.Hour, nil)
			iss.Hasher = h
			ah := NewAuthorizeHandler(discardLogger(), nil, fleet, iss)
			return func(token, id string) int {
				rec := httptest.NewRecorder()
				ah.ServeHTTP(rec, bearer(httptest.NewRequest(http.MethodPost, "/authorize?id="+id, nil), token))
				return rec.Code
			}
		},
		"/metrics/v1/receive": func(fleet FleetAuthorizer) func(token, id string) int {
			mw := Middleware(NewTelemeterBearer(nil, fleet, TelemeterOptions{Hasher: h}), PermWrite, nil,
				http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
			return func(token, id string) int {
				rec := httptest.NewRecorder()
				mw.ServeHTTP(rec, bearerReq(telemeterBearer(token, id)))
				return rec.Code
			}
		},
	}
	for path, newPath := range paths {
		t.Run(path, func(t *testing.T) {
			registry := &firstUseRegistry{owners: map[string]string{}}
			srv := httptest.NewServer(registry)
			defer srv.Close()
			ask := newPath(NewWebhook(srv.URL, srv.Client()))
			ok := http.StatusOK
			if path != "/authorize" {
				ok = http.StatusNoContent
			}

			require.Equal(t, ok, ask("victim", raw))
			require.Equal(t, webhookRequest{Token: "victim", ClusterID: raw, StoredID: stolen}, registry.last(), "a raw id is hashed")

			require.Equal(t, http.StatusForbidden, ask("attacker", stolen), "another cluster's stored id")
			require.Equal(t, webhookRequest{Token: "attacker", ClusterID: stolen, StoredID: stolen}, registry.last(), "a pseudonym is kept")

			require.Equal(t, ok, ask("forwarder", forwarder))
			require.Equal(t, webhookRequest{Token: "forwarder", ClusterID: forwarder, StoredID: forwarder}, registry.last())
		})
	}
}

// TestWebhookStoredIDWithoutHash: without cluster_id_hash an id is stored
// as sent, and stored_id says so.
func TestWebhookStoredIDWithoutHash(t *testing.T) {
	registry := &firstUseRegistry{owners: map[string]string{}}
	srv := httptest.NewServer(registry)
	defer srv.Close()
	a := NewTelemeterBearer(nil, NewWebhook(srv.URL, srv.Client()), TelemeterOptions{})
	id, err := a.Authenticate(bearerReq(telemeterBearer("fleet", "c1")))
	require.NoError(t, err)
	require.Equal(t, "c1", id.ClusterID)
	require.Equal(t, webhookRequest{Token: "fleet", ClusterID: "c1", StoredID: "c1"}, registry.last())
}
