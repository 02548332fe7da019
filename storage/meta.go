package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/phonehome/phonehome/atomicfile"
)

// ThanosMeta is meta.json as Thanos reads it (pkg/block/metadata.Meta): the
// TSDB meta plus a "thanos" section. Field names must match Thanos.
type ThanosMeta struct {
	tsdb.BlockMeta
	Thanos ThanosSection `json:"thanos"`
}

// ThanosSection is meta.json's "thanos" section.
type ThanosSection struct {
	Version      int               `json:"version,omitempty"`
	Labels       map[string]string `json:"labels"`
	Downsample   ThanosDownsample  `json:"downsample"`
	Source       string            `json:"source"`
	SegmentFiles []string          `json:"segment_files,omitempty"`
	Files        []ThanosFile      `json:"files,omitempty"`
	// IndexStats and Extensions are kept as they are when a block is
	// rewritten (an erasure): Thanos' compactor writes the first (the
	// largest series and chunk, which a rewrite does not make larger), and
	// other tools the second.
	IndexStats json.RawMessage `json:"index_stats,omitempty"`
	Extensions json.RawMessage `json:"extensions,omitempty"`
}

// ThanosDownsample is the resolution of a block; 0 for raw data.
type ThanosDownsample struct {
	Resolution int64 `json:"resolution"`
}

// ThanosFile is one object of a block, with its size.
type ThanosFile struct {
	RelPath   string `json:"rel_path"`
	SizeBytes int64  `json:"size_bytes,omitempty"` // omitted for meta.json, as Thanos does
}

// blockFiles lists the files to upload, relative to the block dir, sorted,
// excluding meta.json (uploaded last) and tombstones (Thanos ignores them).
func blockFiles(dir string) ([]ThanosFile, error) {
	var files []ThanosFile
	entries, err := os.ReadDir(filepath.Join(dir, "chunks"))
	if err != nil {
		return nil, fmt.Errorf("read chunks dir: %w", err)
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			return nil, fmt.Errorf("stat chunk file: %w", err)
		}
		files = append(files, ThanosFile{RelPath: "chunks/" + e.Name(), SizeBytes: info.Size()})
	}
	info, err := os.Stat(filepath.Join(dir, "index"))
	if err != nil {
		return nil, fmt.Errorf("stat index: %w", err)
	}
	files = append(files, ThanosFile{RelPath: "index", SizeBytes: info.Size()})
	slices.SortFunc(files, func(a, b ThanosFile) int { return strings.Compare(a.RelPath, b.RelPath) })
	return files, nil
}

// Sources of uploaded blocks, in meta.json's thanos.source.
const (
	SourceReceive   = "receive"   // cut from a receiver's head
	SourceCompactor = "compactor" // merged by the lifecycle compactor
	SourceErasure   = "erasure"   // rewritten without an erased cluster
)

// withFiles returns m with the files of its block listed, as Thanos
// lists them (meta.json included, without size), and version 1.
func withFiles(m ThanosMeta, files []ThanosFile) ThanosMeta {
	var segments []string
	for _, f := range files {
		if name, ok := strings.CutPrefix(f.RelPath, "chunks/"); ok {
			segments = append(segments, name)
		}
	}
	all := append(slices.Clone(files), ThanosFile{RelPath: "meta.json"})
	slices.SortFunc(all, func(a, b ThanosFile) int { return strings.Compare(a.RelPath, b.RelPath) })
	m.Thanos.Version, m.Thanos.SegmentFiles, m.Thanos.Files = 1, segments, all
	return m
}

// shipperFile records uploaded blocks in a tenant dir, like Thanos'
// thanos.shipper.json, so a restart does not re-upload them.
const shipperFile = "phonehome.shipper.json"

type shipperState struct {
	Version  int         `json:"version"`
	Uploaded []ulid.ULID `json:"uploaded"`
}

func readShipped(dir string) (map[ulid.ULID]struct{}, error) {
	b, err := os.ReadFile(filepath.Join(dir, shipperFile))
	if errors.Is(err, fs.ErrNotExist) {
		return map[ulid.ULID]struct{}{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read shipper state: %w", err)
	}
	var s shipperState
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("decode shipper state %s: %w", filepath.Join(dir, shipperFile), err)
	}
	m := make(map[ulid.ULID]struct{}, len(s.Uploaded))
	for _, id := range s.Uploaded {
		m[id] = struct{}{}
	}
	return m, nil
}

// writeShipped replaces the state file atomically (tmp, fsync, rename).
func writeShipped(dir string, uploaded map[ulid.ULID]struct{}) error {
	s := shipperState{Version: 1, Uploaded: make([]ulid.ULID, 0, len(uploaded))}
	for id := range uploaded {
		s.Uploaded = append(s.Uploaded, id)
	}
	slices.SortFunc(s.Uploaded, func(a, b ulid.ULID) int { return a.Compare(b) })
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode shipper state: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, shipperFile), b, 0o640); err != nil {
		return fmt.Errorf("write shipper state: %w", err)
	}
	return nil
}
