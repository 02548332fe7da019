package limits

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func inflightSpec(n int) Config {
	return Config{Defaults: Spec{MaxInflightRequestsPerCluster: ptr(n)}}
}

func TestInflightAtUnderOver(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inFlight int
		ok       bool
	}{
		{"under", 2, true}, // the 3rd of 4
		{"at", 3, true},    // the 4th of 4
		{"over", 4, false}, // a 5th
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			l := New(reg, inflightSpec(4), nil)
			for range tc.inFlight {
				_, err := l.StartRequest("t", "c")
				require.NoError(t, err)
			}
			f, err := l.StartRequest("t", "c")
			if tc.ok {
				require.NoError(t, err)
				f.Done()
				return
			}
			require.ErrorIs(t, err, ErrRateLimited)
			require.Equal(t, LimitInflightRequestsPerCluster, limitOf(t, err))
			require.Contains(t, err.Error(), "max_inflight_requests_per_cluster limit of 4")
			require.Equal(t, 1.0, testutil.ToFloat64(l.m.rejected[LimitInflightRequestsPerCluster]))
			f.Done() // the zero InFlight: a no-op
			_, err = l.StartRequest("t", "c")
			require.ErrorIs(t, err, ErrRateLimited, "a refused request counted nothing, freed nothing")
		})
	}
}

func TestInflightDoneFreesAndClustersAreIndependent(t *testing.T) {
	l := New(nil, inflightSpec(2), nil)
	a1, err := l.StartRequest("t", "a")
	require.NoError(t, err)
	_, err = l.StartRequest("t", "a")
	require.NoError(t, err)
	_, err = l.StartRequest("t", "a")
	require.ErrorIs(t, err, ErrRateLimited)

	for _, other := range [][2]string{{"t", "b"}, {"u", "a"}} {
		f, err := l.StartRequest(other[0], other[1])
		require.NoError(t, err, "%v has its own count", other)
		f.Done()
	}
	for range 5 {
		f, err := l.StartRequest("t", "")
		require.NoError(t, err, "a credential without a cluster is not limited")
		defer f.Done()
	}

	a1.Done()
	a3, err := l.StartRequest("t", "a")
	require.NoError(t, err, "Done freed a slot")
	a3.Done()
	require.Len(t, l.tenant("t").inflight, 1, "only a's remaining request")
}

func TestInflightHotReload(t *testing.T) {
	l := New(nil, inflightSpec(0), nil) // unlimited, yet counted
	var held []InFlight
	for range 5 {
		f, err := l.StartRequest("t", "c")
		require.NoError(t, err)
		held = append(held, f)
	}
	l.Reload(inflightSpec(3))
	_, err := l.StartRequest("t", "c")
	require.ErrorIs(t, err, ErrRateLimited, "lowered below what is in flight: refused at once")
	held[0].Done()
	held[1].Done()
	_, err = l.StartRequest("t", "c")
	require.ErrorIs(t, err, ErrRateLimited, "3 still in flight")
	held[2].Done()
	f, err := l.StartRequest("t", "c")
	require.NoError(t, err, "2 in flight, limit 3")
	held = append(held[3:], f)

	l.Reload(Config{Defaults: Spec{}, Tenants: map[string]Spec{"t": {MaxInflightRequestsPerCluster: ptr(10)}}})
	for range 7 {
		f, err := l.StartRequest("t", "c")
		require.NoError(t, err, "raised by a tenant override")
		held = append(held, f)
	}
	_, err = l.StartRequest("t", "c")
	require.ErrorIs(t, err, ErrRateLimited, "10 in flight")
	for _, f := range held {
		f.Done()
	}
	require.Empty(t, l.tenant("t").inflight)
}

func TestInflightConcurrent(t *testing.T) {
	const limit = 3
	l := New(nil, inflightSpec(limit), nil)
	var mu sync.Mutex
	cur, peak := 0, 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				f, err := l.StartRequest("t", "c")
				if err != nil {
					continue
				}
				mu.Lock()
				cur++
				peak = max(peak, cur)
				mu.Unlock()
				mu.Lock()
				cur--
				mu.Unlock()
				f.Done()
			}
		})
	}
	wg.Wait()
	require.LessOrEqual(t, peak, limit)
	require.Empty(t, l.tenant("t").inflight)
}

func TestInflightConfig(t *testing.T) {
	cfg, err := decode(t, `
limits:
  defaults:
    max_inflight_requests_per_cluster: 2
  tenants:
    prom:
      max_inflight_requests_per_cluster: 0
`)
	require.NoError(t, err)
	require.NoError(t, cfg.Validate())
	l := New(nil, cfg, nil)
	require.Equal(t, 2, l.For("acme").MaxInflightRequestsPerCluster)
	require.Equal(t, 0, l.For("prom").MaxInflightRequestsPerCluster, "0 = unlimited, not unset")
	require.Equal(t, 8, New(nil, Config{}, nil).For("x").MaxInflightRequestsPerCluster, "built-in default")

	bad, err := decode(t, `
limits:
  tenants:
    acme:
      max_inflight_requests_per_cluster: -1
`)
	require.NoError(t, err)
	require.ErrorContains(t, bad.Validate(), "limits.tenants.acme.max_inflight_requests_per_cluster: must not be negative")
}
