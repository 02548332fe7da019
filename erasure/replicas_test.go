package erasure

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/peers"
)

// fakeReplicas answers every broadcast with answers and records the calls,
// and the error of each call's context.
type fakeReplicas struct {
	answers []peers.Answer
	calls   []string // path authorization body
	ctxErrs []error
}

func (f *fakeReplicas) Broadcast(ctx context.Context, path, authorization string, body []byte) []peers.Answer {
	f.calls = append(f.calls, path+" "+authorization+" "+string(body))
	f.ctxErrs = append(f.ctxErrs, ctx.Err())
	return f.answers
}

func (f *fakeReplicas) Peers() []string { return nil }

func (f *fakeReplicas) Repeat(context.Context, string, string, string, []byte) peers.Answer {
	panic("no retries without Run")
}

// TestAdminCallsAreRepeatedOnTheReplicas: an erasure and a re-admission are
// repeated on the other replicas with the caller's credential and the
// tenant filled in; the answer lists each replica's job or error, with a
// warning for each that did not take it. A call a replica repeated here is
// not repeated again, and its audit names the replica.
func TestAdminCallsAreRepeatedOnTheReplicas(t *testing.T) {
	e, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &fakeBucket{}, filepath.Join(t.TempDir(), "jobs"), Options{})
	require.NoError(t, err)
	replicas := &fakeReplicas{answers: []peers.Answer{
		{Peer: "10.0.0.2:9291", Code: http.StatusAccepted, Body: []byte(`{"status":"success","data":{"id":"01JOB","state":"pending"}}`)},
		{Peer: "10.0.0.3:9291", Code: http.StatusForbidden, Body: []byte(`{"status":"error","error":"forbidden"}`)},
		{Peer: "10.0.0.4:9291", Err: errors.New("connection refused")},
	}}
	h := auth.Middleware(auth.Insecure{Tenant: "acme"}, 0, nil, e.Handler(NewRepeater(slog.New(slog.DiscardHandler), nil, replicas)))
	call := func(path, body string, hdr http.Header) (int, map[string]json.RawMessage) {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer adm1n")
		for k, v := range hdr {
			req.Header[k] = v
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var env map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &env), rec.Body.String())
		return rec.Code, env
	}

	code, env := call("/api/v1/admin/erase", `{"cluster_id":"c1","requested_by":"ticket-1"}`, nil)
	require.Equal(t, http.StatusAccepted, code)
	require.Equal(t, []string{`/api/v1/admin/erase Bearer adm1n {"tenant":"acme","cluster_id":"c1","requested_by":"ticket-1"}`}, replicas.calls)
	var data struct {
		ID       string          `json:"id"`
		Replicas []ReplicaResult `json:"replicas"`
	}
	require.NoError(t, json.Unmarshal(env["data"], &data))
	require.NotEmpty(t, data.ID, "the local job, as before")
	require.Equal(t, []ReplicaResult{
		{Replica: "10.0.0.2:9291", Job: "01JOB"},
		{Replica: "10.0.0.3:9291", Error: "403: forbidden"},
		{Replica: "10.0.0.4:9291", Error: "connection refused"},
	}, data.Replicas)
	var warnings []string
	require.NoError(t, json.Unmarshal(env["warnings"], &warnings))
	require.Len(t, warnings, 2)
	require.Contains(t, warnings[0], "replica 10.0.0.3:9291 refused it (403: forbidden): not retried")
	require.Contains(t, warnings[1], "replica 10.0.0.4:9291 did not take it (connection refused): this replica retries it there for up to 1h0m0s")

	replicas.calls = nil
	replicas.answers = []peers.Answer{{Peer: "10.0.0.2:9291", Code: http.StatusOK, Body: []byte(`{"status":"success","data":{"readmitted":true}}`)}}
	code, env = call("/api/v1/admin/readmit", `{"cluster_id":"c1"}`, nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, []string{`/api/v1/admin/readmit Bearer adm1n {"tenant":"acme","cluster_id":"c1"}`}, replicas.calls)
	require.JSONEq(t, `{"readmitted":true,"replicas":[{"replica":"10.0.0.2:9291","readmitted":true}]}`, string(env["data"]))
	require.NotContains(t, env, "warnings")

	// Repeated by a replica: done here, not repeated.
	replicas.calls = nil
	code, env = call("/api/v1/admin/erase", `{"cluster_id":"c2"}`, http.Header{peers.OriginHeader: {"a1b2"}})
	require.Equal(t, http.StatusAccepted, code)
	require.Empty(t, replicas.calls)
	var st Status
	require.NoError(t, json.Unmarshal(env["data"], &st))
	require.Contains(t, st.Caller, "repeated by the replica at ")
	require.NotContains(t, string(env["data"]), `"replicas"`)
}

// TestRepeatOutlivesTheCaller: a caller that goes away once its erasure is
// taken here (a client timeout, Ctrl-C) does not cancel the calls that
// repeat it on the other replicas.
func TestRepeatOutlivesTheCaller(t *testing.T) {
	e, err := New(slog.New(slog.DiscardHandler), nil, &fakeLocal{}, &fakeBucket{}, filepath.Join(t.TempDir(), "jobs"), Options{})
	require.NoError(t, err)
	replicas := &fakeReplicas{answers: []peers.Answer{{Peer: "10.0.0.2:9291", Code: http.StatusAccepted, Body: []byte(`{"status":"success","data":{"id":"01JOB"}}`)}}}
	h := auth.Middleware(auth.Insecure{Tenant: "acme"}, 0, nil, e.Handler(NewRepeater(slog.New(slog.DiscardHandler), nil, replicas)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/api/v1/admin/erase", strings.NewReader(`{"cluster_id":"c1"}`))
	h.ServeHTTP(httptest.NewRecorder(), req)
	require.Len(t, replicas.calls, 1)
	require.NoError(t, replicas.ctxErrs[0])
}
