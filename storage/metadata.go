package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/tsdb/record"
	"github.com/prometheus/prometheus/tsdb/wlog"

	"github.com/phonehome/phonehome/atomicfile"
)

// Metric metadata (type, help, unit) of remote-write 2.0.
//
// Durability: Write passes each series' metadata to the TSDB appender's
// UpdateMetadata in the same transaction as its samples, so it is in the WAL
// (and in WAL checkpoints, for series still in the head) when the write is
// acknowledged; TSDB only logs it when it changed for that series.
//
// Reads: TSDB v0.316.0 keeps the metadata of each head series in memory but
// has no API to read it back, and persisted blocks do not carry it. So each
// tenant keeps a small index, metric family → distinct metadata, updated
// after each commit. The WAL alone is not enough to rebuild it: once series
// leave the head (head compaction, and the flush at shutdown) their metadata
// leaves the WAL checkpoint. So the index is also saved to metadataFile in
// the tenant directory after every ship round in which it changed and at
// Close, and rebuilt at open from that file plus the metadata and series
// records of the WAL (read before tsdb.Open, while nothing else touches it).
// After a crash, only metadata first seen since the last save for series
// that left the head since is lost.

// maxMetadataPerMetric bounds the distinct metadata kept per metric family
// (different clusters may run versions with different help texts); the
// oldest is dropped first.
const maxMetadataPerMetric = 8

// maxMetadataFamilies bounds the metric families a tenant's index holds.
const maxMetadataFamilies = 100_000

// metadataIndex is one tenant's metric family → distinct metadata, oldest
// first. It is safe for concurrent use.
type metadataIndex struct {
	mu       sync.RWMutex
	byFamily map[string][]metadata.Metadata
	dirty    bool // changed since the last save
}

// metadataFile holds a tenant's metadata index between runs.
const metadataFile = "phonehome.metadata.json"

// metadataState is the content of metadataFile.
type metadataState struct {
	Version  int                            `json:"version"`
	Families map[string][]metadata.Metadata `json:"families"`
}

// load reads metadataFile in dir, if any.
func (ix *metadataIndex) load(dir string) error {
	path := filepath.Join(dir, metadataFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read metadata: %w", err)
	}
	var st metadataState
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("decode metadata %s: %w", path, err)
	}
	for fam, ms := range st.Families {
		for _, m := range ms {
			ix.addFamily(fam, m)
		}
	}
	ix.dirty = false
	return nil
}

// save writes the index to metadataFile in dir if it changed.
func (ix *metadataIndex) save(dir string) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if !ix.dirty {
		return nil
	}
	b, err := json.Marshal(metadataState{Version: 1, Families: ix.byFamily})
	if err != nil {
		return fmt.Errorf("encode metadata: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, metadataFile), b, 0o640); err != nil {
		return fmt.Errorf("write metadata: %w", err)
	}
	ix.dirty = false
	return nil
}

func newMetadataIndex() *metadataIndex {
	return &metadataIndex{byFamily: map[string][]metadata.Metadata{}}
}

// add records m for the series named name.
func (ix *metadataIndex) add(name string, m metadata.Metadata) {
	if name == "" || isZeroMetadata(m) {
		return
	}
	ix.addFamily(familyName(name, m.Type), m)
}

// addFamily records m for the metric family fam.
func (ix *metadataIndex) addFamily(fam string, m metadata.Metadata) {
	ix.mu.RLock()
	known := slices.Contains(ix.byFamily[fam], m)
	ix.mu.RUnlock()
	if known {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ms, ok := ix.byFamily[fam]
	if !ok && len(ix.byFamily) >= maxMetadataFamilies {
		return // bounded: a tenant with this many families is misbehaving
	}
	if i := slices.Index(ms, m); i >= 0 {
		return
	}
	if len(ms) >= maxMetadataPerMetric {
		ms = slices.Delete(ms, 0, 1)
	}
	ix.byFamily[fam] = append(ms, m)
	ix.dirty = true
}

// get returns copies of the metadata of metric (or of all metrics when
// metric is ""), at most limit metrics when limit >= 0.
func (ix *metadataIndex) get(metric string, limit int) map[string][]metadata.Metadata {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := map[string][]metadata.Metadata{}
	if metric != "" {
		if ms, ok := ix.byFamily[metric]; ok && limit != 0 {
			out[metric] = slices.Clone(ms)
		}
		return out
	}
	for fam, ms := range ix.byFamily {
		if limit >= 0 && len(out) >= limit {
			break
		}
		out[fam] = slices.Clone(ms)
	}
	return out
}

func isZeroMetadata(m metadata.Metadata) bool {
	return (m.Type == "" || m.Type == model.MetricTypeUnknown) && m.Help == "" && m.Unit == ""
}

// familyName maps a series name to its metric family, as a scrape's
// metadata cache keys it: the _bucket, _sum, _count (and gauge histogram
// _gsum, _gcount) series of a classic histogram or summary belong to the
// family without the suffix. Native histograms and other types carry the
// family name already.
func familyName(name string, t model.MetricType) string {
	var suffixes []string
	switch t {
	case model.MetricTypeHistogram:
		suffixes = []string{"_bucket", "_sum", "_count"}
	case model.MetricTypeGaugeHistogram:
		suffixes = []string{"_bucket", "_gsum", "_gcount"}
	case model.MetricTypeSummary:
		suffixes = []string{"_sum", "_count"}
	}
	for _, s := range suffixes {
		if f, ok := strings.CutSuffix(name, s); ok && f != "" {
			return f
		}
	}
	return name
}

// Metadata returns the tenant's metric metadata by metric family: only
// metric's when metric is not empty, and at most limit families when limit
// is not negative. An unknown tenant has none. The result is the caller's.
func (db *DB) Metadata(tenant, metric string, limit int) (map[string][]metadata.Metadata, error) {
	t, release, err := db.readTenant(tenant)
	if err != nil {
		return nil, err
	}
	defer release()
	if t == nil {
		return map[string][]metadata.Metadata{}, nil
	}
	return t.meta.get(metric, limit), nil
}

// readMetadata rebuilds a tenant's metadata index from its metadataFile and
// the metadata and series records of its WAL (the last checkpoint, then the
// segments).
// A torn or corrupt tail (TSDB repairs it on open) ends the read with what
// was read so far and a logged warning.
func readMetadata(logger *slog.Logger, tenantDir string) (*metadataIndex, error) {
	ix := newMetadataIndex()
	if err := ix.load(tenantDir); err != nil {
		return nil, err
	}
	walDir := filepath.Join(tenantDir, "wal")
	if _, err := os.Stat(walDir); errors.Is(err, os.ErrNotExist) {
		return ix, nil
	}
	names := map[chunks.HeadSeriesRef]string{}
	var (
		dec    = record.NewDecoder(nil, logger)
		series []record.RefSeries
		metas  []record.RefMetadata
	)
	read := func(dir string) error {
		sr, err := wlog.NewSegmentsReader(dir)
		if err != nil {
			return fmt.Errorf("open wal %s: %w", dir, err)
		}
		defer sr.Close()
		r := wlog.NewReader(sr)
		for r.Next() {
			rec := r.Record()
			switch dec.Type(rec) {
			case record.Series:
				if series, err = dec.Series(rec, series[:0]); err != nil {
					return fmt.Errorf("decode series record: %w", err)
				}
				for _, s := range series {
					names[s.Ref] = s.Labels.Get(model.MetricNameLabel)
				}
			case record.Metadata:
				if metas, err = dec.Metadata(rec, metas[:0]); err != nil {
					return fmt.Errorf("decode metadata record: %w", err)
				}
				for _, m := range metas {
					ix.add(names[m.Ref], metadata.Metadata{Type: record.ToMetricType(m.Type), Unit: m.Unit, Help: m.Help})
				}
			}
		}
		return r.Err()
	}
	cp, _, err := wlog.LastCheckpoint(walDir)
	switch {
	case errors.Is(err, record.ErrNotFound):
	case err != nil:
		return nil, fmt.Errorf("find wal checkpoint: %w", err)
	default:
		if err := read(cp); err != nil {
			logger.Warn("wal checkpoint metadata read incomplete", "dir", cp, "err", err)
		}
	}
	// Segments at or before the checkpoint's index are normally deleted;
	// reading any that remain only re-adds metadata already known.
	if err := read(walDir); err != nil {
		logger.Warn("wal metadata read incomplete", "dir", walDir, "err", err)
	}
	return ix, nil
}

// WriteFamilyMetadata keeps remote-write 1.0 metadata, which names metric
// families rather than series. It is saved with the index (after ship rounds
// and at Close), not in the WAL: 1.0 senders resend it every minute or so.
func (db *DB) WriteFamilyMetadata(tenant string, md []prompb.MetricMetadata) error {
	if err := validTenant(tenant); err != nil {
		return err
	}
	db.lifecycle.RLock()
	defer db.lifecycle.RUnlock()
	if db.closed {
		return ErrNotReady
	}
	t, err := db.tenantForWrite(tenant)
	if err != nil {
		return err
	}
	for _, m := range md {
		if m.MetricFamilyName == "" {
			continue
		}
		mm := metadata.Metadata{Type: model.MetricType(strings.ToLower(m.Type.String())), Help: m.Help, Unit: m.Unit}
		if m.Type == prompb.MetricMetadata_UNKNOWN {
			mm.Type = model.MetricTypeUnknown
		}
		if !isZeroMetadata(mm) {
			t.meta.addFamily(m.MetricFamilyName, mm)
		}
	}
	return nil
}
