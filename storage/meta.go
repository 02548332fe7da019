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

// thanosMeta is meta.json as Thanos reads it (pkg/block/metadata.Meta): the
// TSDB meta plus a "thanos" section. Field names must match Thanos.
type thanosMeta struct {
	tsdb.BlockMeta
	Thanos thanosSection `json:"thanos"`
}

type thanosSection struct {
	Version      int               `json:"version,omitempty"`
	Labels       map[string]string `json:"labels"`
	Downsample   thanosDownsample  `json:"downsample"`
	Source       string            `json:"source"`
	SegmentFiles []string          `json:"segment_files,omitempty"`
	Files        []thanosFile      `json:"files,omitempty"`
}

type thanosDownsample struct {
	Resolution int64 `json:"resolution"`
}

type thanosFile struct {
	RelPath   string `json:"rel_path"`
	SizeBytes int64  `json:"size_bytes,omitempty"` // omitted for meta.json, as Thanos does
}

// blockFiles lists the files to upload, relative to the block dir, sorted,
// excluding meta.json (uploaded last) and tombstones (Thanos ignores them).
func blockFiles(dir string) ([]thanosFile, error) {
	var files []thanosFile
	entries, err := os.ReadDir(filepath.Join(dir, "chunks"))
	if err != nil {
		return nil, fmt.Errorf("read chunks dir: %w", err)
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			return nil, fmt.Errorf("stat chunk file: %w", err)
		}
		files = append(files, thanosFile{RelPath: "chunks/" + e.Name(), SizeBytes: info.Size()})
	}
	info, err := os.Stat(filepath.Join(dir, "index"))
	if err != nil {
		return nil, fmt.Errorf("stat index: %w", err)
	}
	files = append(files, thanosFile{RelPath: "index", SizeBytes: info.Size()})
	slices.SortFunc(files, func(a, b thanosFile) int { return strings.Compare(a.RelPath, b.RelPath) })
	return files, nil
}

// newThanosMeta builds meta.json for upload from the block's own meta.
func newThanosMeta(meta tsdb.BlockMeta, labels map[string]string, files []thanosFile) thanosMeta {
	var segments []string
	for _, f := range files {
		if name, ok := strings.CutPrefix(f.RelPath, "chunks/"); ok {
			segments = append(segments, name)
		}
	}
	all := append(slices.Clone(files), thanosFile{RelPath: "meta.json"})
	slices.SortFunc(all, func(a, b thanosFile) int { return strings.Compare(a.RelPath, b.RelPath) })
	return thanosMeta{
		BlockMeta: meta,
		Thanos: thanosSection{
			Version:      1,
			Labels:       labels,
			Source:       "receive",
			SegmentFiles: segments,
			Files:        all,
		},
	}
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
