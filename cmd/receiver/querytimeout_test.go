package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// --query.timeout defaults to Prometheus' 2m.
func TestQueryTimeoutDefaultsToPrometheus(t *testing.T) {
	var stderr bytes.Buffer
	require.Equal(t, 0, run([]string{"--help"}, &stderr))
	usage := regexp.MustCompile(`(?m)^  -query\.timeout duration\n(?:    \t.*\n)*`).FindString(stderr.String())
	require.NotEmpty(t, usage, stderr.String())
	require.Contains(t, usage, "(default 2m0s)")
}

// --query.timeout must be positive: 0 would time out every query.
func TestQueryTimeoutMustBePositive(t *testing.T) {
	for _, v := range []string{"0s", "-1m0s"} {
		var stderr bytes.Buffer
		require.Equal(t, 2, run([]string{"--query.timeout=" + v, "--check-config", "--insecure.no-auth"}, &stderr), v)
		require.Contains(t, stderr.String(), "--query.timeout "+v+": want a positive duration")
	}
}

// --query.timeout bounds every query, and the API's timeout parameter
// cannot lengthen it: both fail with Prometheus' timeout error.
func TestQueryTimeoutAbortsQueries(t *testing.T) {
	base := startReceiver(t, "--insecure.no-auth", "--query.timeout=1ns", "--storage.path="+filepath.Join(t.TempDir(), "data"))
	for _, params := range []url.Values{
		{"query": {"1"}},
		{"query": {"1"}, "timeout": {"1m"}},
	} {
		var code int
		var body string
		deadline := time.Now().Add(30 * time.Second)
		for { // 503 "not ready" until the storage is
			code, _, body = call(t, "GET", base+"/api/v1/query?"+params.Encode(), "")
			if json.Valid([]byte(body)) {
				break
			}
			require.True(t, time.Now().Before(deadline), "not ready after 30s: %d %s", code, body)
		}
		var answer struct{ Status, ErrorType, Error string }
		require.NoError(t, json.Unmarshal([]byte(body), &answer))
		require.Equal(t, http.StatusServiceUnavailable, code, body)
		require.Equal(t, "error", answer.Status)
		require.Equal(t, "timeout", answer.ErrorType, body)
		require.Contains(t, answer.Error, "query timed out", params.Encode())
	}
}
