package push

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"
)

// scanVictims is the full scan and sort that evictOrder replaced, kept as
// the oracle of TestEvictOrderMatchesTheFullScan: the series (as label
// strings, sorted) that make room for need more, or false if too few can go.
func scanVictims(v view, inPush map[string]float64, need int, idleBefore int64) ([]string, bool) {
	type unit struct {
		refs            []string
		once, idle, out bool
		touched         int64
		seq             uint64
		key             string
	}
	units := map[string]*unit{}
	for k, it := range v.ts.Series {
		uk := k
		if lk, ok := layoutKeyOf(it.Labels); ok {
			if _, hist := v.ts.Layouts[lk]; hist {
				uk = "\xffh" + lk
			}
		}
		u := units[uk]
		if u == nil {
			u = &unit{once: true, idle: true, key: uk}
			units[uk] = u
		}
		_, pushed := inPush[k]
		_, pending := v.ps.values[k]
		u.refs = append(u.refs, it.Labels.String())
		u.out = u.out || pushed || pending || v.ps.gone[k] || it.seq > v.ts.flushedSeq
		u.once = u.once && it.Pushes == 1
		u.idle = u.idle && it.Touched < idleBefore
		u.touched, u.seq = max(u.touched, it.Touched), max(u.seq, it.seq)
	}
	var cands []*unit
	for _, u := range units {
		if !u.out && (u.once || u.idle) {
			cands = append(cands, u)
		}
	}
	slices.SortFunc(cands, func(a, b *unit) int {
		if a.once != b.once {
			if a.once {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(a.touched, b.touched), cmp.Compare(a.seq, b.seq), strings.Compare(a.key, b.key))
	})
	var out []string
	for _, u := range cands {
		if need <= 0 {
			break
		}
		out = append(out, u.refs...)
		need -= len(u.refs)
	}
	if need > 0 {
		return nil, false
	}
	slices.Sort(out)
	return out, true
}

// The order built once per flush evicts exactly what a full scan of the
// tenant's series would, push after push, through flushes, pending
// records, histograms, idle time and refusals.
func TestEvictOrderMatchesTheFullScan(t *testing.T) {
	ctx := context.Background()
	series := seriesMaker()
	compared, refused := 0, 0
	for seed := range 6 {
		rnd := rand.New(rand.NewPCG(uint64(seed), 1))
		now := time.Unix(1_800_000_000, 0)
		g := openEvictTestGateway(t, &now)
		for range 400 {
			switch r := rnd.IntN(16); {
			case r <= 1:
				g.Flush(ctx)
				continue
			case r == 3:
				_, err := g.Erase("t", []*labels.Matcher{labels.MustNewMatcher(labels.MatchEqual, "k", fmt.Sprint(rnd.IntN(40)))})
				require.NoError(t, err)
				continue
			case r == 2:
				now = now.Add(time.Duration(rnd.IntN(30)) * time.Hour)
				continue
			case r == 4:
				g.syncMu.Lock()
				g.mu.Lock()
				g.commitLocked()
				g.mu.Unlock()
				g.syncMu.Unlock()
				continue
			}
			rec := randomEvictRecord(rnd, series)
			needed, full, err := evictionsMatchFullScan(g, rec, now)
			require.NoError(t, err, "seed %d", seed)
			if needed {
				compared++
			}
			if full {
				refused++
			}

			if rnd.IntN(3) == 0 { // pending: settled by a later push, commit or flush
				g.mu.Lock()
				_, _ = g.appendLocked(rec)
				g.mu.Unlock()
			} else {
				_ = g.accept(rec)
			}
		}
		require.NoError(t, g.Close())
	}
	t.Logf("%d evictions compared, %d refusals", compared, refused)
	require.Greater(t, compared-refused, 300)
	require.Greater(t, refused, 20)
}

// openEvictTestGateway opens a Gateway with a series budget of 24, whose
// clock reads *now, and whose log does not fsync.
func openEvictTestGateway(t *testing.T, now *time.Time) *Gateway {
	cfg := testConfig()
	cfg.MaxSeriesPerTenant = 24
	g, err := Open(slog.New(slog.DiscardHandler), prometheus.NewRegistry(), t.TempDir(), &fakeWriter{}, cfg, Options{Now: func() time.Time { return *now }})
	require.NoError(t, err)
	withoutFsyncs(g)
	return g
}

// seriesMaker returns a builder of labels in a symbol table of its own (it
// is not safe for concurrent use).
func seriesMaker() func(name string, kv ...string) labels.Labels {
	tbl := labels.NewSymbolTable()
	return func(name string, kv ...string) labels.Labels {
		sb := labels.NewScratchBuilderWithSymbolTable(tbl, 3)
		sb.Add("__name__", name)
		for i := 0; i < len(kv); i += 2 {
			sb.Add(kv[i], kv[i+1])
		}
		sb.Sort()
		return sb.Labels()
	}
}

// randomEvictRecord is a push to tenant "t" of one to three of 40 counter
// series, and one time in five one of 4 histograms.
func randomEvictRecord(rnd *rand.Rand, series func(name string, kv ...string) labels.Labels) *record {
	rec := &record{Tenant: "t", Types: map[string]string{"installs_total": "counter"}, Layouts: map[string]string{}}
	for range 1 + rnd.IntN(3) {
		rec.Samples = append(rec.Samples, delta{Labels: series("installs_total", "k", fmt.Sprint(rnd.IntN(40))), Value: 1})
	}
	if rnd.IntN(5) == 0 {
		h := fmt.Sprint(rnd.IntN(4))
		rec.Types["install_seconds"] = "histogram"
		rec.Layouts[series("install_seconds", "h", h).String()] = "1,+Inf"
		rec.Samples = append(rec.Samples,
			delta{Labels: series("install_seconds_bucket", "h", h, "le", "1"), Value: 1},
			delta{Labels: series("install_seconds_bucket", "h", h, "le", "+Inf"), Value: 1},
			delta{Labels: series("install_seconds_sum", "h", h), Value: 1},
			delta{Labels: series("install_seconds_count", "h", h), Value: 1})
	}
	return rec
}

// evictionsMatchFullScan reports whether rec needs room in the tenant's
// budget and, if so, whether none can be made, and an error unless the
// Gateway would evict exactly what scanVictims picks (or refuse as it
// does). It changes nothing but the eviction order's bookkeeping. Safe for
// concurrent use (it holds the Gateway's mutex).
func evictionsMatchFullScan(g *Gateway, rec *record, now time.Time) (needed, refused bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	v := g.viewLocked(rec.Tenant)
	inPush, created := map[string]float64{}, 0
	for _, d := range rec.Samples {
		k := seriesKey(d.Labels)
		if _, seen := inPush[k]; !seen {
			if _, held := v.value(k); !held {
				created++
			}
		}
		inPush[k] = 0
	}
	need := v.series() + created - g.cfg.MaxSeriesPerTenant
	if need <= 0 {
		return false, false, nil
	}
	idleBefore := now.UnixMilli() - time.Duration(g.cfg.EvictIdleAfter).Milliseconds()
	want, ok := scanVictims(v, inPush, need, idleBefore)
	probe := &record{}
	mkErr := g.makeRoomLocked(probe, v, inPush, need, created, now.UnixMilli())
	if ok != (mkErr == nil) {
		return true, !ok, fmt.Errorf("need %d created %d: the full scan makes room: %v; the order: %w", need, created, ok, mkErr)
	}
	var got []string
	for _, e := range probe.Evict {
		got = append(got, e.String())
	}
	slices.Sort(got)
	if !slices.Equal(want, got) {
		return true, !ok, fmt.Errorf("need %d created %d: the full scan evicts %q, the order %q", need, created, want, got)
	}
	return true, !ok, nil
}
