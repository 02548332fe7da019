package auth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// clusterIDRE bounds what a pseudonymous cluster id may look like: the
// forwarder sends a keyed hash, never a raw id, so this is generous.
var clusterIDRE = regexp.MustCompile(`^[A-Za-z0-9_=.:-]{1,128}$`)

// ErrUpstream means the upstream authorizer could not give an answer.
var ErrUpstream = errors.New("upstream authorizer unavailable")

// ClusterIDs names a cluster asking for a credential: the id it sent, and
// the id the credential binds and its data is stored as (its pseudonym
// with cluster_id_hash, else the same). Stored is the identity that
// matters: pseudonyms are visible to anyone who reads fleet data, so an
// authorizer that only checked Sent would let a client claim another
// cluster's stored id.
type ClusterIDs struct {
	Sent   string
	Stored string
}

// FleetAuthorizer decides whether a fleet token may obtain a credential for
// a cluster, and for which tenant.
type FleetAuthorizer interface {
	AuthorizeFleet(ctx context.Context, token string, cluster ClusterIDs) (tenant string, err error)
}

// AuthorizeFleet implements FleetAuthorizer for static tokens: the token
// needs the authorize permission, and a token bound to a cluster only
// authorizes that cluster. A tokens file may bind by either form of the
// id: the raw id a telemeter-client sends, or the pseudonym stored with
// cluster_id_hash (what an operator reads in the fleet's data).
func (t *Tokens) AuthorizeFleet(_ context.Context, token string, cluster ClusterIDs) (string, error) {
	id, err := t.lookup(token)
	if err != nil {
		return "", err
	}
	if id.Allow&PermAuthorize == 0 {
		return "", errMayNotAuthorize
	}
	if id.ClusterID != "" && id.ClusterID != cluster.Sent && id.ClusterID != cluster.Stored {
		return "", fmt.Errorf("token is bound to another cluster: %w", ErrForbidden)
	}
	return id.Tenant, nil
}

// AuthorizeResponse is the JSON body of a successful POST /authorize. It
// carries telemeter-client's fields (version, token, expiresInSeconds and
// labels with _id) next to ours, so a stock telemeter-client can use it.
type AuthorizeResponse struct {
	Token            string    `json:"token"`
	ExpiresAt        time.Time `json:"expires_at"`
	ExpiresInSeconds int64     `json:"expires_in_seconds"`
	Tenant           string    `json:"tenant"`
	ClusterID        string    `json:"cluster_id"`
	// Telemeter's protocol (v1): telemeter-client adds Labels to every
	// metric it uploads and renews the token after TelemeterExpiresIn.
	Version            int               `json:"version"`
	TelemeterExpiresIn int64             `json:"expiresInSeconds"`
	Labels             map[string]string `json:"labels"`
}

// telemeterProtocolVersion is the version telemeter-client's authorize
// exchange answers with.
const telemeterProtocolVersion = 1

// AuthorizeHandler serves POST /authorize: a fleet token (bearer) plus the
// cluster's id (parameter `id`, in the query as telemeter-client sends it or
// in a form body as the forwarder does) buys a short-lived credential
// binding tenant and `_id`.
type AuthorizeHandler struct {
	logger   *slog.Logger
	fleet    FleetAuthorizer
	issuer   *Issuer
	results  *prometheus.CounterVec
	upstream upstreamLog

	// Erased, if set before the handler serves, refuses a cluster its
	// error names (the receiver's: one erased and not re-admitted, whose
	// writes storage refuses): 403 with the error's text, and no
	// credential, so none of its writes reach the write path either.
	Erased func(tenant, cluster string) error
}

// NewAuthorizeHandler returns the /authorize handler. reg may be nil. With
// the issuer's Hasher, an id sent in clear (telemeter-client sends the raw
// cluster id) is bound as its pseudonym, and sealed in the credential.
func NewAuthorizeHandler(logger *slog.Logger, reg prometheus.Registerer, fleet FleetAuthorizer, issuer *Issuer) *AuthorizeHandler {
	h := &AuthorizeHandler{
		logger: logger, fleet: fleet, issuer: issuer,
		upstream: upstreamLog{logger: logger, now: time.Now},
		results: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_auth_authorize_requests_total",
			Help: "POST /authorize requests by result.",
		}, []string{"result"}),
	}
	for _, r := range []string{"issued", "unauthorized", "forbidden", "invalid", "upstream_error", "error"} {
		h.results.WithLabelValues(r)
	}
	return h
}

func (h *AuthorizeHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token, ok := bearerToken(r)
	if !ok {
		h.fail(w, "unauthorized", http.StatusUnauthorized, "a fleet token is required as bearer token")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	var tooLarge *http.MaxBytesError
	if err := r.ParseForm(); errors.As(err, &tooLarge) { // else the cut form reads as a bad id
		h.fail(w, "invalid", http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds the limit of %d bytes", tooLarge.Limit))
		return
	}
	sent := r.FormValue("id")
	if !clusterIDRE.MatchString(sent) {
		h.fail(w, "invalid", http.StatusBadRequest, "parameter id (query or form) must be the cluster's id ("+clusterIDRE.String()+")")
		return
	}
	cluster, err := h.issuer.Hasher.ids(sent)
	if err != nil {
		h.fail(w, "invalid", http.StatusBadRequest, "parameter id: "+err.Error())
		return
	}
	tenant, err := h.fleet.AuthorizeFleet(r.Context(), token, cluster)
	switch {
	case err == nil:
	case errors.Is(err, errMayNotAuthorize):
		h.fail(w, "forbidden", http.StatusForbidden, "forbidden: this token lacks the authorize permission (allow: [authorize]): only fleet tokens are exchanged here")
		return
	case errors.Is(err, ErrForbidden):
		h.fail(w, "forbidden", http.StatusForbidden, "forbidden: this fleet token may not authorize this cluster")
		return
	case errors.Is(err, ErrUnauthorized):
		h.fail(w, "unauthorized", http.StatusUnauthorized, "unknown fleet token")
		return
	case errors.Is(err, ErrUpstream):
		h.upstream.log(r.Context(), err, cluster)
		w.Header().Set("Retry-After", "30")
		h.fail(w, "upstream_error", http.StatusServiceUnavailable, "the upstream authorizer is unavailable, retry later")
		return
	default:
		h.logger.Error("authorize", "err", err)
		h.fail(w, "error", http.StatusInternalServerError, "internal error")
		return
	}
	clusterID := cluster.Stored
	if h.Erased != nil {
		if err := h.Erased(tenant, clusterID); err != nil {
			h.fail(w, "forbidden", http.StatusForbidden, err.Error())
			return
		}
	}
	signed, exp, err := h.issuer.IssueCluster(tenant, cluster)
	if err != nil {
		h.logger.Error("issue credential", "err", err)
		h.fail(w, "error", http.StatusInternalServerError, "internal error")
		return
	}
	h.results.WithLabelValues("issued").Inc()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	expiresIn := int64(math.Round(time.Until(exp).Seconds())) // 3600, not 3599: telemeter-client caches only >= 60
	_ = json.NewEncoder(w).Encode(AuthorizeResponse{
		Token: signed, ExpiresAt: exp.UTC(), ExpiresInSeconds: expiresIn,
		Tenant: tenant, ClusterID: clusterID,
		Version: telemeterProtocolVersion, TelemeterExpiresIn: expiresIn,
		Labels: map[string]string{"_id": clusterID},
	})
}

func (h *AuthorizeHandler) fail(w http.ResponseWriter, result string, code int, msg string) {
	h.results.WithLabelValues(result).Inc()
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="phonehome"`)
	}
	http.Error(w, msg, code)
}

// Webhook asks an upstream HTTP service whether a fleet token may authorize
// a cluster. It POSTs {"token": ..., "cluster_id": ..., "stored_id": ...}
// as JSON (cluster_id as the cluster sent it, stored_id the _id the
// credential binds) and expects 200 with {"tenant": ...}; 401 and 403
// refuse; anything else is ErrUpstream. A webhook that approves ids it has
// not seen before must bind on stored_id: a client may send another
// cluster's stored id, which anyone who reads fleet data knows.
type Webhook struct {
	URL    string
	Client *http.Client // nil: http.DefaultClient
	// sem bounds the lookups in flight (NewWebhook); nil: unbounded.
	sem chan struct{}
}

// WebhookMaxInflight is how many lookups NewWebhook's Webhook runs at once.
// Each credential never seen before costs one (at /authorize, and on
// Telemeter's write path, where answers are cached), so a flood of made-up
// bearers would otherwise hold as many receiver goroutines and upstream
// requests, up to its timeout each.
const WebhookMaxInflight = 64

// NewWebhook returns a Webhook running at most WebhookMaxInflight lookups at
// once; more fail at once with ErrUpstream (503, retry later).
// It follows no redirect: a redirect would send the fleet token wherever
// it pointed; it is answered as any other unexpected status (ErrUpstream).
func NewWebhook(url string, client *http.Client) Webhook {
	return Webhook{URL: url, Client: noRedirects(client), sem: make(chan struct{}, WebhookMaxInflight)}
}

// noRedirects returns a copy of c (http.DefaultClient if nil) that returns
// a redirect response instead of following it.
func noRedirects(c *http.Client) *http.Client {
	if c == nil {
		c = http.DefaultClient
	}
	cc := *c
	cc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &cc
}

// AuthorizeFleet implements FleetAuthorizer.
func (wh Webhook) AuthorizeFleet(ctx context.Context, token string, cluster ClusterIDs) (string, error) {
	if wh.sem != nil {
		select {
		case wh.sem <- struct{}{}:
			defer func() { <-wh.sem }()
		default:
			return "", fmt.Errorf("webhook: %d lookups in flight: %w", cap(wh.sem), ErrUpstream)
		}
	}
	body, _ := json.Marshal(map[string]string{"token": token, "cluster_id": cluster.Sent, "stored_id": cluster.Stored})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, wh.URL, bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("webhook request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	client := wh.Client
	if client == nil || client.CheckRedirect == nil {
		client = noRedirects(client)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("webhook: %w: %w", ErrUpstream, err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized:
		return "", fmt.Errorf("webhook refused the token: %w", ErrUnauthorized)
	case http.StatusForbidden:
		return "", fmt.Errorf("webhook refused the cluster: %w", ErrForbidden)
	default:
		return "", &webhookStatusError{code: resp.StatusCode}
	}
	var out struct {
		Tenant string `json:"tenant"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&out); err != nil || !ValidTenant(out.Tenant) {
		return "", fmt.Errorf("webhook answer has no valid tenant: %w", ErrUpstream)
	}
	return out.Tenant, nil
}
