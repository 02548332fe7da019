package query

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/golang/snappy"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/promql/parser/posrange"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/storage/remote"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
)

var errPeerDown = fmt.Errorf("peer 10.0.3.7:9291 unavailable, its data is missing: %w", errors.New("remote_read: connection refused"))

// failingQuerier fails every Select with err.
type failingQuerier struct {
	promstorage.Querier
	err error
}

func (q failingQuerier) Select(context.Context, bool, *promstorage.SelectHints, ...*labels.Matcher) promstorage.SeriesSet {
	return promstorage.ErrSeriesSet(q.err)
}

func (failingQuerier) Close() error { return nil }

// fleet is a Reader as peers.Reader builds it: local data (job a and b)
// merged with a secondary, here one that fails as an unreachable peer does.
type fleet struct {
	local     tenantDBs
	secondary func() promstorage.Querier // nil: no secondary
	lateWarn  error                      // a warning once the local set is exhausted (a peer dead mid-stream)
}

func (f fleet) Querier(tenant string, mint, maxt int64) (promstorage.Querier, error) {
	q, err := f.local.Querier(tenant, mint, maxt)
	if err != nil {
		return nil, err
	}
	if f.lateWarn != nil {
		q = lateWarnQuerier{Querier: q, err: f.lateWarn}
	}
	if f.secondary == nil {
		return q, nil
	}
	return promstorage.NewMergeQuerier([]promstorage.Querier{q}, []promstorage.Querier{f.secondary()}, promstorage.ChainedSeriesMerge), nil
}

type lateWarnQuerier struct {
	promstorage.Querier
	err error
}

func (q lateWarnQuerier) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.SeriesSet {
	return &lateWarnSet{SeriesSet: q.Querier.Select(ctx, sortSeries, hints, ms...), err: q.err}
}

type lateWarnSet struct {
	promstorage.SeriesSet
	err  error
	done bool
}

func (s *lateWarnSet) Next() bool {
	if s.SeriesSet.Next() {
		return true
	}
	s.done = true
	return false
}

func (s *lateWarnSet) Warnings() annotations.Annotations {
	if !s.done {
		return s.SeriesSet.Warnings()
	}
	ws := s.SeriesSet.Warnings()
	return ws.Add(s.err)
}

func TestMissingData(t *testing.T) {
	var info, warn annotations.Annotations
	info.Add(annotations.NewPossibleNonCounterInfo("up", posrange.PositionRange{}))
	warn.Add(annotations.NewBadBucketLabelWarning("up", "x", posrange.PositionRange{}))
	for _, tc := range []struct {
		name string
		ws   []error
		want string // "" for nil
	}{
		{name: "none"},
		{name: "PromQL info", ws: []error{info.AsErrors()[0]}},
		{name: "PromQL warning", ws: []error{warn.AsErrors()[0]}},
		{name: "peer unavailable", ws: []error{errPeerDown, info.AsErrors()[0]}, want: "partial data: peer 10.0.3.7:9291 unavailable"},
		{name: "bucket block and pushdown shard, sorted", ws: []error{
			errors.New("peer 10.0.3.8:9291 unavailable, its data is missing: shard unavailable"),
			errors.New("bucket block 01J0000000000000000000000: get index: timeout"),
		}, want: "partial data: bucket block 01J0000000000000000000000: get index: timeout; peer 10.0.3.8:9291 unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ws annotations.Annotations
			for _, w := range tc.ws {
				ws.Add(w)
			}
			err := MissingData(ws)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrPartialData)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// readRequest is a remote-read request for up over the test data.
func readRequest(t *testing.T, streamed bool) *http.Request {
	t.Helper()
	rr := &prompb.ReadRequest{Queries: []*prompb.Query{{
		StartTimestampMs: 0, EndTimestampMs: 2_000_000,
		Matchers: []*prompb.LabelMatcher{{Type: prompb.LabelMatcher_EQ, Name: "__name__", Value: "up"}},
	}}}
	if streamed {
		rr.AcceptedResponseTypes = []prompb.ReadRequest_ResponseType{prompb.ReadRequest_STREAMED_XOR_CHUNKS}
	}
	b, err := rr.Marshal()
	require.NoError(t, err)
	r, err := http.NewRequest(http.MethodPost, "/api/v1/read", bytes.NewReader(snappy.Encode(nil, b)))
	require.NoError(t, err)
	r.Header.Set("Content-Encoding", "snappy")
	r.Header.Set("Content-Type", "application/x-protobuf")
	r.Header.Set("X-Prometheus-Remote-Read-Version", "0.1.0")
	return r
}

// read serves one remote read of the acme tenant through a real server
// (a streamed response may be aborted) and returns the status, the series
// read (or the error body) and the error reading the response, if any.
func read(t *testing.T, r Reader, streamed bool) (int, string, error) {
	t.Helper()
	h := NewReadHandler(discardLogger(), nil, r, ReadOptions{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		h.ServeHTTP(w, req.WithContext(auth.WithIdentity(req.Context(), auth.Identity{Tenant: "acme"})))
	}))
	defer srv.Close()
	req := readRequest(t, streamed)
	req.URL.Scheme, req.URL.Host = "http", srv.Listener.Addr().String()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body), nil
	}
	var got []string
	if streamed {
		cr := remote.NewChunkedReader(resp.Body, 50<<20, nil)
		for {
			var res prompb.ChunkedReadResponse
			err := cr.NextProto(&res)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return resp.StatusCode, fmt.Sprint(got), err
			}
			for _, s := range res.ChunkedSeries {
				got = append(got, s.Labels[1].Value)
			}
		}
		slices.Sort(got)
		return resp.StatusCode, fmt.Sprint(got), nil
	}
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	raw, err := snappy.Decode(nil, b)
	require.NoError(t, err)
	var rr prompb.ReadResponse
	require.NoError(t, rr.Unmarshal(raw))
	for _, s := range rr.Results[0].Timeseries {
		got = append(got, s.Labels[1].Value)
	}
	slices.Sort(got)
	return resp.StatusCode, fmt.Sprint(got), nil
}

// TestReadFailsOnPartialData: a remote read whose data is known to be
// partial fails with a 5xx naming the reason, sampled or streamed, rather
// than answering with the rest; PromQL-free reads of complete data answer.
func TestReadFailsOnPartialData(t *testing.T) {
	local := tenantDBs{"acme": openDB(t, map[string]float64{"a": 1, "b": 1})}
	healthy := fleet{local: local, secondary: func() promstorage.Querier { return promstorage.NoopQuerier() }}
	peerDown := fleet{local: local, secondary: func() promstorage.Querier { return failingQuerier{err: errPeerDown} }}
	blockMissing := fleet{local: local, secondary: func() promstorage.Querier {
		return failingQuerier{err: errors.New("bucket block 01J0000000000000000000000: download: timeout")}
	}}
	for _, streamed := range []bool{false, true} {
		t.Run(fmt.Sprintf("streamed=%v", streamed), func(t *testing.T) {
			code, got, err := read(t, healthy, streamed)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, "[a b]", got)

			code, body, err := read(t, peerDown, streamed)
			require.NoError(t, err)
			require.Equal(t, http.StatusInternalServerError, code)
			require.Contains(t, body, "partial data: peer 10.0.3.7:9291 unavailable, its data is missing")

			code, body, err = read(t, blockMissing, streamed)
			require.NoError(t, err)
			require.Equal(t, http.StatusInternalServerError, code)
			require.Contains(t, body, "partial data: bucket block 01J0000000000000000000000")
		})
	}
}

// TestReadFailsOnDataMissingMidStream: a peer that dies after its first
// series is known only at the end. A sampled answer is still buffered: 5xx.
// A streamed one has begun (more than net/http buffers: the status line and
// frames are on the wire): the connection is aborted, so the client fails
// instead of taking the rest for the whole.
func TestReadFailsOnDataMissingMidStream(t *testing.T) {
	jobs := map[string]float64{}
	for i := range 500 {
		jobs[strconv.Itoa(i)] = 1
	}
	late := fleet{local: tenantDBs{"acme": openDB(t, jobs)}, lateWarn: errPeerDown}

	code, body, err := read(t, late, false)
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, code)
	require.Contains(t, body, "partial data: peer 10.0.3.7:9291 unavailable")

	code, got, err := read(t, late, true)
	require.Equal(t, http.StatusOK, code, "the answer has begun")
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "stream read completely: %.100s", got)

	// Complete, the same read streams to the end.
	late.lateWarn = nil
	_, got, err = read(t, late, true)
	require.NoError(t, err)
	require.Len(t, slices.Collect(strings.FieldsSeq(strings.Trim(got, "[]"))), 500)
}
