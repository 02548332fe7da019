package query

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
)

// flight holds every call until want are in flight together, then lets
// them all through, and every later one at once. Calls asked one after
// another never overlap: each gives up after 10s instead, and most tells.
type flight struct {
	want int

	mu        sync.Mutex
	now, most int
	opened    bool
	open      chan struct{}
}

func newFlight(want int) *flight { return &flight{want: want, open: make(chan struct{})} }

func (f *flight) enter(ctx context.Context) {
	f.mu.Lock()
	f.now++
	f.most = max(f.most, f.now)
	if f.now == f.want && !f.opened {
		f.opened = true
		close(f.open)
	}
	f.mu.Unlock()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-f.open:
	case <-t.C:
	case <-ctx.Done():
	}
}

func (f *flight) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now--
}

func (f *flight) mostInFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.most
}

// setsReader answers a label call over a match[] set of one matcher with
// that matcher's value, warned "saw <value>", once its flight lets it:
// except "fail", an error, "hang", which waits for its context to end
// (and counts it in ended), and "panic", which panics.
type setsReader struct {
	f     *flight
	ended atomic.Int64
}

func (r *setsReader) Querier(string, int64, int64) (promstorage.Querier, error) {
	return setsQuerier{Querier: promstorage.NoopQuerier(), r: r}, nil
}

type setsQuerier struct {
	promstorage.Querier
	r *setsReader
}

func (q setsQuerier) answer(ctx context.Context, hints *promstorage.LabelHints, ms []*labels.Matcher) ([]string, annotations.Annotations, error) {
	q.r.f.enter(ctx)
	defer q.r.f.leave()
	v := ms[0].Value
	switch v {
	case "fail":
		return nil, nil, errors.New("set failed")
	case "hang":
		<-ctx.Done()
		q.r.ended.Add(1)
		return nil, nil, ctx.Err()
	case "panic":
		panic("set panicked")
	}
	vals := []string{v, v + "-2"}
	if hints != nil && hints.Limit > 0 {
		vals = vals[:min(hints.Limit, len(vals))]
	}
	var ws annotations.Annotations
	ws.Add(errors.New("saw " + v))
	return vals, ws, nil
}

func (q setsQuerier) LabelValues(ctx context.Context, _ string, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return q.answer(ctx, hints, ms)
}

func (q setsQuerier) LabelNames(ctx context.Context, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return q.answer(ctx, hints, ms)
}

type apiAnswer struct {
	Status, Error string
	Data          []string
	Warnings      []string
}

// callAPI makes a label call of h for tenant acme, by method (a POST
// sends form as its body).
func callAPI(t *testing.T, h http.Handler, method, path string, form url.Values) (int, apiAnswer) {
	t.Helper()
	r := httptest.NewRequest(method, path+"?"+form.Encode(), nil)
	if method == http.MethodPost {
		r = httptest.NewRequest(method, path, strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Tenant: "acme"}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	var a apiAnswer
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &a), rec.Body.String())
	return rec.Code, a
}

func matches(values ...string) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = `{x="` + v + `"}`
	}
	return out
}

// Prometheus' label handlers ask for one match[] set after another; the
// querier asks for them all at the first: the calls are in flight
// together, where one after another each would wait out the flight.
func TestLabelCallsAskTheirMatchSetsTogether(t *testing.T) {
	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, LabelNamesPath},
		{http.MethodPost, LabelNamesPath},
		{http.MethodGet, "/api/v1/label/x/values"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r := &setsReader{f: newFlight(2)}
			h := NewHandler(discardLogger(), nil, r, Options{})
			code, got := callAPI(t, h, tc.method, tc.path, url.Values{"match[]": matches("b", "a")})
			require.Equal(t, http.StatusOK, code, got.Error)
			require.Equal(t, []string{"a", "a-2", "b", "b-2"}, got.Data)
			require.ElementsMatch(t, []string{"saw a", "saw b"}, got.Warnings)
			require.Equal(t, 2, r.f.mostInFlight(), "the two sets were asked together")
		})
	}
}

// Asked together, the sets answer as they did one after another: the
// union, sorted, cut at limit with Prometheus' warning; every set's
// warnings; the first failed set's error; a bad match[] the handler's.
func TestLabelCallMatchSetsAnswerAsBefore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		form     url.Values
		asked    int // distinct sets, asked together
		code     int
		want     []string
		warnings []string
		err      string
	}{
		{
			name: "a set given twice", form: url.Values{"match[]": matches("b", "a", "b")}, asked: 2,
			code: http.StatusOK, want: []string{"a", "a-2", "b", "b-2"}, warnings: []string{"saw a", "saw b"},
		},
		{
			name: "limit", form: url.Values{"match[]": matches("b", "a"), "limit": {"1"}}, asked: 2,
			code: http.StatusOK, want: []string{"a"}, warnings: []string{"saw a", "saw b", "results truncated due to limit"},
		},
		{
			name: "a failed set", form: url.Values{"match[]": matches("a", "fail", "hang")}, asked: 3,
			code: http.StatusUnprocessableEntity, err: "set failed",
		},
		{
			name: "a bad match[]", form: url.Values{"match[]": {`{x="a"}`, `{x=`}},
			code: http.StatusBadRequest, err: "unexpected end of input",
		},
	} {
		for _, path := range []string{LabelNamesPath, "/api/v1/label/x/values"} {
			t.Run(tc.name+" "+path, func(t *testing.T) {
				r := &setsReader{f: newFlight(tc.asked)}
				h := NewHandler(discardLogger(), nil, r, Options{})
				code, got := callAPI(t, h, http.MethodGet, path, tc.form)
				require.Equal(t, tc.code, code, got.Error)
				require.Equal(t, tc.want, got.Data)
				require.ElementsMatch(t, tc.warnings, got.Warnings)
				require.Contains(t, got.Error, tc.err)
				require.Equal(t, tc.asked, r.f.mostInFlight())
				if slices.Contains(tc.form["match[]"], `{x="hang"}`) {
					require.Equal(t, int64(1), r.ended.Load(), "the set after the failed one ended with the call")
				}
			})
		}
	}
}

// One call asks for at most maxParallelSets sets at a time.
func TestLabelCallMatchSetsAreBounded(t *testing.T) {
	require.Equal(t, 16, maxParallelSets, "docs/scale-out.md: up to 16 sets at a time")
	sets := make([]string, maxParallelSets+4)
	for i := range sets {
		sets[i] = string(rune('a' + i))
	}
	r := &setsReader{f: newFlight(maxParallelSets)}
	h := NewHandler(discardLogger(), nil, r, Options{})
	code, got := callAPI(t, h, http.MethodGet, LabelNamesPath, url.Values{"match[]": matches(sets...)})
	require.Equal(t, http.StatusOK, code, got.Error)
	require.Len(t, got.Data, 2*len(sets))
	require.Equal(t, maxParallelSets, r.f.mostInFlight())
}

// A label call that panics fails its request, not the process: asked in a
// goroutine of the batch, its panic is raised again on the handler's, which
// net/http recovers, as when the handler asked for each set itself.
func TestLabelCallMatchSetPanicFailsTheRequestOnly(t *testing.T) {
	r := &setsReader{f: newFlight(2)}
	h := NewHandler(discardLogger(), nil, r, Options{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		h.ServeHTTP(w, req.WithContext(auth.WithIdentity(req.Context(), auth.Identity{Tenant: "acme"})))
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // "http: panic serving"
	srv.Start()
	defer srv.Close()
	for _, path := range []string{LabelNamesPath, "/api/v1/label/x/values"} {
		resp, err := srv.Client().Get(srv.URL + path + "?" + url.Values{"match[]": matches("a", "panic")}.Encode())
		if err == nil {
			resp.Body.Close()
		}
		require.Error(t, err, "%s: net/http ends the connection of a handler that panicked", path)
	}
	code, got := callAPI(t, h, http.MethodGet, LabelNamesPath, url.Values{"match[]": matches("a", "b")})
	require.Equal(t, http.StatusOK, code, got.Error)
}
