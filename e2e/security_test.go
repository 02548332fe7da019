package e2e

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// securityReceiver starts a receiver with cluster credentials enabled and
// returns it with the signing key, so tests can forge near-valid tokens.
func securityReceiver(t *testing.T, limitsYAML string) (*Process, ed25519.PrivateKey, string) {
	t.Helper()
	dir := t.TempDir()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "k1.pem"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "keys.yaml"), []byte("keys:\n- kid: k1\n  created: 2026-01-01T00:00:00Z\n  private_key_file: k1.pem\n"), 0o600))
	tokens := filepath.Join(dir, "tokens.yaml")
	require.NoError(t, os.WriteFile(tokens, []byte(`tokens:
- {token: fleet-acme, tenant: acme, allow: [authorize]}
- {token: fleet-revoked, tenant: acme, allow: [authorize]}
- {token: fleet-globex, tenant: globex, allow: [authorize]}
- {token: read-acme, tenant: acme, allow: [read]}
- {token: read-globex, tenant: globex, allow: [read]}
`), 0o600))
	cfg := "auth:\n  tokens_file: tokens.yaml\n  keys_file: keys.yaml\n  reload_interval: 1s\n"
	if limitsYAML != "" {
		cfg += "limits:\n" + limitsYAML
	}
	p := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(p, []byte(cfg), 0o600))
	return startReceiver(t, p, filepath.Join(dir, "data")), key, tokens
}

// authorize exchanges a fleet token for a cluster credential.
func authorize(t *testing.T, base, fleetToken, clusterID string) (int, string) {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, base+"/authorize", strings.NewReader(url.Values{"id": {clusterID}}.Encode()))
	require.NoError(t, err)
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Authorization", "Bearer "+fleetToken)
	resp, err := http.DefaultClient.Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, string(b)
	}
	var out struct {
		Token     string `json:"token"`
		ClusterID string `json:"cluster_id"`
	}
	require.NoError(t, json.Unmarshal(b, &out))
	require.Equal(t, clusterID, out.ClusterID)
	return resp.StatusCode, out.Token
}

func oneSeries(name string, ts int64, kv ...string) *prompb.WriteRequest {
	return &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
		Labels:  labelsOf(append([]string{"__name__", name}, kv...)...),
		Samples: []prompb.Sample{{Value: 1, Timestamp: ts}},
	}}}
}

func forge(t *testing.T, method jwt.SigningMethod, key any, kid string, mod func(jwt.MapClaims)) string {
	t.Helper()
	c := jwt.MapClaims{
		"iss": "phonehome", "aud": []string{"phonehome-receiver"}, "sub": "victim", "tenant": "acme",
		"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix(),
	}
	if mod != nil {
		mod(c)
	}
	tok := jwt.NewWithClaims(method, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	require.NoError(t, err)
	return s
}

func TestSecuritySpoofingFails(t *testing.T) {
	recv, key, tokensFile := securityReceiver(t, "")
	base := recv.URL()
	now := time.Now().UnixMilli()

	code, cred := authorize(t, base, "fleet-acme", "cluster-a")
	require.Equal(t, http.StatusOK, code, cred)
	code, body, err := postWrite(http.DefaultClient, base, cred, encodeWrite(t, oneSeries("up", now, "job", "a")), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusNoContent, code, body)

	_, otherKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	parts := strings.Split(cred, ".")

	for _, tc := range []struct {
		name   string
		token  string
		req    *prompb.WriteRequest
		header map[string]string
		want   int
	}{
		{"another cluster's _id", cred, oneSeries("up", now, "_id", "victim", "job", "a"), nil, http.StatusBadRequest},
		{"forged signature", parts[0] + "." + parts[1] + "." + strings.Repeat("A", 86), oneSeries("up", now), nil, http.StatusUnauthorized},
		{"alg none", forge(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "k1", nil), oneSeries("up", now), nil, http.StatusUnauthorized},
		{"expired", forge(t, jwt.SigningMethodEdDSA, key, "k1", func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Hour).Unix() }), oneSeries("up", now), nil, http.StatusUnauthorized},
		{"unknown kid", forge(t, jwt.SigningMethodEdDSA, otherKey, "k2", nil), oneSeries("up", now), nil, http.StatusUnauthorized},
		{"right kid, wrong key", forge(t, jwt.SigningMethodEdDSA, otherKey, "k1", nil), oneSeries("up", now), nil, http.StatusUnauthorized},
		{"a fleet token cannot write", "fleet-acme", oneSeries("up", now), nil, http.StatusForbidden},
		{"a read token cannot write", "read-acme", oneSeries("up", now), nil, http.StatusForbidden},
		{"tenant header injection is ignored", cred, oneSeries("injected", now), map[string]string{"X-Scope-OrgID": "globex", "THANOS-TENANT": "globex"}, http.StatusNoContent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, err := postWrite(http.DefaultClient, base, tc.token, encodeWrite(t, tc.req), tc.header)
			require.NoError(t, err)
			require.Equal(t, tc.want, code, body)
		})
	}

	at := time.UnixMilli(now)
	require.Empty(t, instant(t, base, "read-globex", "injected", at).Result, "a tenant header cannot move data to another tenant")
	require.Len(t, instant(t, base, "read-acme", "injected", at).Result, 1)
	require.Empty(t, instant(t, base, "read-acme", `up{_id="victim"}`, at).Result, "nothing was written as the victim")
	require.Empty(t, instant(t, base, "read-globex", "up", at).Result, "another tenant's token sees nothing of acme")
	code, _ = apiGet(t, base, cred, "/api/v1/query", url.Values{"query": {"up"}})
	require.Equal(t, http.StatusForbidden, code, "a cluster credential cannot read the fleet")

	mfs := scrapeMetrics(t, base)
	require.InDelta(t, 1, metricValue(mfs, "phonehome_receive_rejected_samples_total", map[string]string{"reason": "cluster_mismatch"}), 0)
	require.GreaterOrEqual(t, metricValue(mfs, "phonehome_receive_unauthenticated_requests_total", nil), 7.0)

	// A cluster-bound token's credential for the wrong tenant: globex's fleet token
	// authorizes globex only.
	code, globexCred := authorize(t, base, "fleet-globex", "cluster-g")
	require.Equal(t, http.StatusOK, code)
	code, body, err = postWrite(http.DefaultClient, base, globexCred, encodeWrite(t, oneSeries("globex_only", now)), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusNoContent, code, body)
	require.Empty(t, instant(t, base, "read-acme", "globex_only", at).Result)

	// Revocation: the revoked fleet token fails at the next authorize.
	code, _ = authorize(t, base, "fleet-revoked", "cluster-r")
	require.Equal(t, http.StatusOK, code)
	b, err := os.ReadFile(tokensFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(tokensFile, []byte(strings.Replace(string(b), "- {token: fleet-revoked, tenant: acme, allow: [authorize]}\n", "", 1)), 0o600))
	eventually(t, 30*time.Second, func() error {
		if code, _ := authorize(t, base, "fleet-revoked", "cluster-r"); code != http.StatusUnauthorized {
			return fmt.Errorf("revoked token still authorizes: %d", code)
		}
		return nil
	})
}

func TestSecurityNoisyNeighbour(t *testing.T) {
	recv, _, _ := securityReceiver(t, `  defaults:
    max_series_per_cluster: 200
    samples_per_second_per_cluster: 2000
    burst_per_cluster: 4000
`)
	base := recv.URL()
	_, noisyCred := authorize(t, base, "fleet-acme", "noisy")
	_, calmCred := authorize(t, base, "fleet-acme", "calm")
	start := time.Now().Add(-time.Minute).UnixMilli()

	var wg sync.WaitGroup
	stop := make(chan struct{})
	var limited, refused atomic.Int64
	for w := range 2 { // the noisy cluster: ever-new series, as fast as it can
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 400; i++ {
				select {
				case <-stop:
					return
				default:
				}
				req := &prompb.WriteRequest{}
				for j := range 200 {
					req.Timeseries = append(req.Timeseries, prompb.TimeSeries{
						Labels:  labelsOf("__name__", "noise", "n", fmt.Sprintf("%d-%d-%d", w, i, j)),
						Samples: []prompb.Sample{{Value: 1, Timestamp: start + int64(i)}},
					})
				}
				code, _, err := postWrite(http.DefaultClient, base, noisyCred, encodeWrite(t, req), nil)
				switch {
				case err != nil:
				case code == http.StatusTooManyRequests:
					limited.Add(1)
				case code == http.StatusBadRequest:
					refused.Add(1)
				}
			}
		}()
	}

	// The calm cluster writes 50 series every round and must lose nothing.
	const rounds = 40
	for i := range rounds {
		req := &prompb.WriteRequest{}
		for j := range 50 {
			req.Timeseries = append(req.Timeseries, prompb.TimeSeries{
				Labels:  labelsOf("__name__", "calm", "n", fmt.Sprint(j)),
				Samples: []prompb.Sample{{Value: float64(i), Timestamp: start + int64(i)*1000}},
			})
		}
		code, body, err := postWrite(http.DefaultClient, base, calmCred, encodeWrite(t, req), nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusNoContent, code, "round %d: %s", i, body)
	}
	close(stop)
	wg.Wait()

	require.Positive(t, limited.Load()+refused.Load(), "the noisy cluster hit its limits")
	var r queryResult
	apiData(t, base, "read-acme", "/api/v1/query", url.Values{
		"query": {fmt.Sprintf("count_over_time(calm[%ds])", rounds+5)},
		"time":  {formatTime(time.UnixMilli(start + rounds*1000))},
	}, &r)
	require.Len(t, r.Result, 50)
	for _, s := range r.Result {
		require.Equal(t, fmt.Sprintf("%q", fmt.Sprint(rounds)), string(s.Value[1]), "every calm sample was stored: %v", s.Metric)
	}
	mfs := scrapeMetrics(t, base)
	require.Positive(t, metricValue(mfs, "phonehome_limits_rejected_total", map[string]string{"limit": "max_series_per_cluster"})+
		metricValue(mfs, "phonehome_limits_rejected_total", map[string]string{"limit": "samples_per_second_per_cluster"}))
}
