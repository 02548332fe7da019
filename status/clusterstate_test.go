package status

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/atomicfile"
	"github.com/phonehome/phonehome/limits"
)

// restart builds what a restarted receiver has: a fresh limiter, its
// clusters restored from path, and the status page over it.
func restart(t *testing.T, clk *clock, path string, denied func(tenant, cluster string) bool) (*Status, *ClusterState) {
	t.Helper()
	l := limits.New(nil, limits.Config{}, clk.now)
	l.TrackClusters([]string{"series_limit", "rate_limit"})
	cs := NewClusterState(slog.New(slog.DiscardHandler), prometheus.NewRegistry(), l, path, denied)
	return New(slog.New(slog.DiscardHandler), nil, Options{Limiter: l, Now: clk.now}), cs
}

// loadFailures is the count of failed loads of cs's file.
func loadFailures(cs *ClusterState) float64 {
	return testutil.ToFloat64(cs.failures.WithLabelValues("load"))
}

func clusterRows(t *testing.T, s *Status, query string) map[string]clusterJSON {
	t.Helper()
	a := get(t, s, reader, "/api/v1/status/clusters?limit=1000"+query)
	require.Equal(t, 200, a.code)
	var p page
	require.NoError(t, json.Unmarshal(a.body.Data, &p))
	out := map[string]clusterJSON{}
	for _, c := range p.Clusters {
		out[c.ID] = c
	}
	return out
}

// The clusters saved before a restart are on the page after it, silent
// once their last-seen time says so, until ClusterRetention drops them;
// erased ones (denied) are not restored.
func TestClusterStateSurvivesARestart(t *testing.T) {
	s, l, clk := fixture(t)
	path := filepath.Join(t.TempDir(), "status", "clusters.json")
	before := clusterRows(t, s, "")
	require.NoError(t, NewClusterState(slog.New(slog.DiscardHandler), nil, l, path, nil).Save())

	clk.add(20 * time.Minute) // the upgrade, and 3 intervals (13m30s) without a write
	denied := func(tenant, cluster string) bool { return tenant == "acme" && cluster == "c007" }
	s2, cs := restart(t, clk, path, denied)
	after := clusterRows(t, s2, "")
	require.Len(t, after, len(before)-1)
	require.NotContains(t, after, "c007", "erased after the file was written")
	for id, was := range after {
		require.Equal(t, "silent", was.State, id)
		require.Equal(t, before[id].LastSeen.Unix(), was.LastSeen.Unix(), id)
		require.Equal(t, before[id].Client, was.Client, id)
		require.Equal(t, before[id].Protocol, was.Protocol, id)
		require.Equal(t, before[id].Refused, was.Refused, id)
	}
	require.EqualValues(t, 5, after["noisy"].Refused["series_limit"])
	require.Len(t, clusterRows(t, s2, "&state=silent"), len(after))
	a := get(t, s2, reader, "/api/v1/status/overview")
	var ov struct {
		Clusters map[string]figure `json:"clusters"`
	}
	require.NoError(t, json.Unmarshal(a.body.Data, &ov))
	require.EqualValues(t, len(after), ov.Clusters["silent"].Value)
	require.EqualValues(t, len(after), ov.Clusters["known"].Value)
	require.Zero(t, loadFailures(cs))

	clk.add(limits.ClusterRetention)
	s2.opts.Limiter.Expire()
	require.Empty(t, clusterRows(t, s2, ""), "gone after ClusterRetention, as in one process")
}

// An erased cluster leaves what will be saved with the limiter's memory.
func TestClusterStateSavesNoForgottenCluster(t *testing.T) {
	_, l, clk := fixture(t)
	path := filepath.Join(t.TempDir(), "clusters.json")
	l.Forget("acme", "c003")
	require.NoError(t, NewClusterState(slog.New(slog.DiscardHandler), nil, l, path, nil).Save())
	s2, _ := restart(t, clk, path, nil)
	rows := clusterRows(t, s2, "")
	require.Contains(t, rows, "c004")
	require.NotContains(t, rows, "c003")
}

// A corrupt, foreign or unreadable file does not stop the start: the page
// starts without its clusters, and the failure is counted. A missing file
// (the first start) is no failure.
func TestClusterStateBadFileStartsEmpty(t *testing.T) {
	dir := t.TempDir()
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	for name, content := range map[string]string{
		"torn":        `{"version":1,"names":[],"tenants":{"acme":[{"id":"c1","se`,
		"not json":    "\x00\x01binary",
		"new version": `{"version":2,"tenants":{"acme":[{"id":"c1","seen":1772366400000}]}}`,
		"directory":   "",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name)
			if name == "directory" {
				require.NoError(t, os.Mkdir(path, 0o700))
			} else {
				require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
			}
			s, cs := restart(t, clk, path, nil)
			require.Empty(t, clusterRows(t, s, ""))
			require.EqualValues(t, 1, loadFailures(cs))
		})
	}
	_, cs := restart(t, clk, filepath.Join(dir, "missing"), nil)
	require.Zero(t, loadFailures(cs))
}

// A receiver killed while writing the file leaves a temporary file: the
// next start removes it, and the file still loads.
func TestClusterStateRemovesTemporaryFilesOfACrash(t *testing.T) {
	_, l, clk := fixture(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "clusters.json")
	require.NoError(t, NewClusterState(slog.New(slog.DiscardHandler), nil, l, path, nil).Save())
	_, err := atomicfile.Prepare(path, []byte("torn"), 0o600)
	require.NoError(t, err)
	s2, _ := restart(t, clk, path, nil)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "only the clusters file is left")
	require.NotEmpty(t, clusterRows(t, s2, ""))
}

// BenchmarkClusterState writes and restores 100k clusters, a large
// tenant, and reports the file's size.
func BenchmarkClusterState(b *testing.B) {
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	l := limits.New(nil, limits.Config{}, clk.now)
	l.TrackClusters([]string{"series_limit", "rate_limit"})
	for i := range 100_000 {
		s := l.Session("acme", fmt.Sprintf("%022x", uint64(i)*0x9e3779b97f4a7c15)) // as long as an _id pseudonym
		for j := range 20 {
			_ = s.Admit("up", hash(fmt.Sprint(i, j)))
		}
		if i%100 == 0 {
			s.Refuse("series_limit", 3, nil)
		}
		s.Definition("v3")
		s.Done("prometheus.WriteRequest", "phonehome-forwarder/1.4.0")
	}
	path := filepath.Join(b.TempDir(), "clusters.json")
	logger := slog.New(slog.DiscardHandler)
	cs := NewClusterState(logger, nil, l, path, nil)
	b.Run("save", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := cs.Save(); err != nil {
				b.Fatal(err)
			}
		}
		fi, err := os.Stat(path)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(fi.Size()), "file-bytes")
		b.ReportMetric(float64(fi.Size())/100_000, "bytes/cluster")
	})
	b.Run("restore", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			fresh := limits.New(nil, limits.Config{}, clk.now)
			fresh.TrackClusters([]string{"series_limit", "rate_limit"})
			NewClusterState(logger, nil, fresh, path, nil)
			if n := len(fresh.Clusters("acme")); n != 100_000 {
				b.Fatalf("%d clusters restored", n)
			}
		}
	})
}

// The file keeps at most 250k clusters per tenant (README), the most
// recently seen.
func TestClusterStateKeepsTheMostRecentlySeen(t *testing.T) {
	require.Equal(t, 250_000, maxSavedClusters, "the number README names")
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	saved := []limits.SavedCluster{{ID: "old", LastSeen: at}, {ID: "new", LastSeen: at.Add(2 * time.Minute)}, {ID: "mid", LastSeen: at.Add(time.Minute)}}
	var kept []string
	for _, c := range mostRecent(saved, 2) {
		kept = append(kept, c.ID)
	}
	require.Equal(t, []string{"new", "mid"}, kept)
	require.Len(t, mostRecent(saved, 3), 3)
}
