package status

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/phonehome/phonehome/atomicfile"
	"github.com/phonehome/phonehome/limits"
)

// The clusters a replica knows live in the limiter's memory; without this
// file a restart (every upgrade) would wipe the list of silent clusters,
// just when an operator asks which clusters did not come back.

// clustersFileVersion is the format of the clusters file; another one is
// not read.
const clustersFileVersion = 1

// maxSavedClusters bounds the clusters saved per tenant, the most recently
// seen first: a tenant has up to about 100k.
const maxSavedClusters = 250_000

// maxClustersFileBytes bounds the clusters file, written and read: about
// 90 bytes a cluster (BenchmarkClusterState), so some 3M clusters.
const maxClustersFileBytes = 256 << 20

type clustersFile struct {
	Version int `json:"version"`
	// Names are the protocol, client and definition strings, which
	// clusters share: a cluster refers to them by index + 1.
	Names   []string                      `json:"names"`
	Tenants map[string][]savedClusterJSON `json:"tenants"`
}

type savedClusterJSON struct {
	ID         string            `json:"id"`
	Seen       int64             `json:"seen"` // Unix milliseconds
	Series     int64             `json:"series,omitempty"`
	Protocol   int               `json:"proto,omitempty"` // in Names, from 1; 0: none
	Client     int               `json:"client,omitempty"`
	Definition int               `json:"def,omitempty"`
	Refused    map[string]uint64 `json:"refused,omitempty"` // by reason
}

// ClusterState keeps the status page's clusters (limits.SavedCluster)
// across restarts in one file. NewClusterState restores them; Run saves
// them every 10 minutes and when it ends, so a crash loses at most the
// last 10 minutes of last-seen times. Safe for concurrent use.
type ClusterState struct {
	logger   *slog.Logger
	limiter  *limits.Limiter
	path     string
	denied   func(tenant, cluster string) bool
	failures *prometheus.CounterVec // by operation: load, save

	// saving serialises Save, so that a save that read the limiter
	// before an erasure's forget cannot replace the file after the save
	// that followed the forget (Forgotten).
	saving sync.Mutex
}

// NewClusterState restores into l, which must track clusters and have
// admitted no write yet, the clusters saved at path by the previous
// process, skipping those denied (erased since: storage.DB.Denied; nil
// denies none). A missing file restores nothing; an unreadable or corrupt
// one is logged and counted, and the page starts without the clusters it
// held. reg may be nil.
func NewClusterState(logger *slog.Logger, reg prometheus.Registerer, l *limits.Limiter, path string, denied func(tenant, cluster string) bool) *ClusterState {
	cs := &ClusterState{
		logger: logger, limiter: l, path: path, denied: denied,
		failures: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "phonehome_status_clusters_file_errors_total",
			Help: "Failed reads (at start) and writes of the status page's clusters file, by operation.",
		}, []string{"operation"}),
	}
	cs.failures.WithLabelValues("load")
	cs.failures.WithLabelValues("save")
	if err := atomicfile.RemoveStale(logger, path); err != nil { // litter only: the file still loads
		logger.Warn("remove temporary status clusters files", "err", err)
	}
	restored, denials, err := cs.restore()
	if err != nil {
		cs.failures.WithLabelValues("load").Inc()
		logger.Warn("status page clusters not restored, the page lists only clusters that write from now on", "file", path, "err", err)
		return cs
	}
	if restored > 0 || denials > 0 {
		logger.Info("status page clusters restored", "file", path, "clusters", restored, "skipped_erased", denials)
	}
	return cs
}

// restore reads the file and restores its clusters; it returns how many,
// and how many it skipped as denied.
func (cs *ClusterState) restore() (restored, denials int, err error) {
	f, err := cs.read()
	if err != nil || f == nil {
		return 0, 0, err
	}
	name := func(i int) string {
		if i < 1 || i > len(f.Names) {
			return ""
		}
		return f.Names[i-1]
	}
	for tenant, rows := range f.Tenants {
		saved := make([]limits.SavedCluster, 0, len(rows))
		for _, r := range rows {
			if cs.denied != nil && cs.denied(tenant, r.ID) {
				denials++
				continue
			}
			saved = append(saved, limits.SavedCluster{
				ID: r.ID, LastSeen: time.UnixMilli(r.Seen), Series: r.Series,
				Protocol: name(r.Protocol), Client: name(r.Client), Definition: name(r.Definition),
				Refused: r.Refused,
			})
		}
		restored += cs.limiter.RestoreClusters(tenant, saved)
	}
	return restored, denials, nil
}

// read decodes the file; nil for a missing one (the first start).
func (cs *ClusterState) read() (*clustersFile, error) {
	var f clustersFile
	found, err := readVersioned(cs.path, maxClustersFileBytes, &f, &f.Version, clustersFileVersion)
	if !found || err != nil {
		return nil, err
	}
	return &f, nil
}

// Run saves the clusters every 10 minutes and once more when ctx is done,
// then returns nil. A failed save is logged and counted; the next one
// tries again.
func (cs *ClusterState) Run(ctx context.Context) error {
	t := time.NewTicker(saveInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			cs.saveLogged()
			return nil
		case <-t.C:
			cs.saveLogged()
		}
	}
}

// Forgotten saves the clusters at once after an erasure made the limiter
// forget one (limits.Limiter.Forget), rather than at the next periodic
// save: a cluster erased without a deny ("deny": false) would otherwise
// come back from the file after a crash within that interval.
func (cs *ClusterState) Forgotten() { cs.saveLogged() }

func (cs *ClusterState) saveLogged() {
	if err := cs.Save(); err != nil {
		cs.failures.WithLabelValues("save").Inc()
		cs.logger.Warn("status page clusters not saved", "file", cs.path, "err", err)
	}
}

// Save writes every tenant's clusters to the file, replacing it
// atomically. An erased cluster is no longer in the limiter, so it is not
// written; one erased after a save is denied, so it is not restored.
func (cs *ClusterState) Save() error {
	cs.saving.Lock()
	defer cs.saving.Unlock()
	f := clustersFile{Version: clustersFileVersion, Names: []string{}, Tenants: map[string][]savedClusterJSON{}}
	ids := map[string]int{}
	index := func(name string) int {
		if name == "" {
			return 0
		}
		if i, ok := ids[name]; ok {
			return i
		}
		f.Names = append(f.Names, name)
		ids[name] = len(f.Names)
		return len(f.Names)
	}
	for _, tenant := range cs.limiter.Tenants() {
		saved := cs.limiter.SavedClusters(tenant)
		if len(saved) == 0 {
			continue
		}
		saved = mostRecent(saved, maxSavedClusters)
		rows := make([]savedClusterJSON, len(saved))
		for i, sc := range saved {
			rows[i] = savedClusterJSON{
				ID: sc.ID, Seen: sc.LastSeen.UnixMilli(), Series: sc.Series,
				Protocol: index(sc.Protocol), Client: index(sc.Client), Definition: index(sc.Definition),
				Refused: sc.Refused,
			}
		}
		f.Tenants[tenant] = rows
	}
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	if len(b) > maxClustersFileBytes {
		return fmt.Errorf("%d bytes, over the %d a start reads back", len(b), maxClustersFileBytes)
	}
	if err := os.MkdirAll(filepath.Dir(cs.path), 0o750); err != nil {
		return err
	}
	return atomicfile.Write(cs.path, b, 0o600)
}

// mostRecent returns the n most recently seen of saved (saved itself if it
// holds no more), reordered.
func mostRecent(saved []limits.SavedCluster, n int) []limits.SavedCluster {
	if len(saved) <= n {
		return saved
	}
	slices.SortFunc(saved, func(a, b limits.SavedCluster) int { return b.LastSeen.Compare(a.LastSeen) })
	return saved[:n]
}
