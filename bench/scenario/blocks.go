package scenario

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Blocks sums the TSDB blocks (directories holding meta.json) under a directory.
type Blocks struct {
	Dir        string `json:"dir"`
	Count      int    `json:"count"`
	Bytes      int64  `json:"bytes"` // every file of every block
	IndexBytes int64  `json:"index_bytes"`
	ChunkBytes int64  `json:"chunk_bytes"`
	NumSamples int64  `json:"num_samples"`
	NumSeries  int64  `json:"num_series"`
	NumChunks  int64  `json:"num_chunks"`
	MinTime    int64  `json:"min_time"`
	MaxTime    int64  `json:"max_time"`

	BytesPerSample      float64 `json:"bytes_per_sample"`
	ChunkBytesPerSample float64 `json:"chunk_bytes_per_sample"`
	IndexBytesPerSeries float64 `json:"index_bytes_per_series"`
}

type blockMeta struct {
	MinTime int64 `json:"minTime"`
	MaxTime int64 `json:"maxTime"`
	Stats   struct {
		NumSamples int64 `json:"numSamples"`
		NumSeries  int64 `json:"numSeries"`
		NumChunks  int64 `json:"numChunks"`
	} `json:"stats"`
}

func measureBlocks(dir string) (Blocks, error) {
	b := Blocks{Dir: dir}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || d.Name() != "meta.json" {
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var m blockMeta
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		blockDir := filepath.Dir(path)
		if err := filepath.WalkDir(blockDir, func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			info, err := e.Info()
			if err != nil {
				return err
			}
			b.Bytes += info.Size()
			switch {
			case e.Name() == "index":
				b.IndexBytes += info.Size()
			case filepath.Base(filepath.Dir(p)) == "chunks":
				b.ChunkBytes += info.Size()
			}
			return nil
		}); err != nil {
			return err
		}
		if b.Count == 0 || m.MinTime < b.MinTime {
			b.MinTime = m.MinTime
		}
		b.MaxTime = max(b.MaxTime, m.MaxTime)
		b.Count++
		b.NumSamples += m.Stats.NumSamples
		b.NumSeries += m.Stats.NumSeries
		b.NumChunks += m.Stats.NumChunks
		return filepath.SkipDir // the block's own files were counted above
	})
	if err != nil {
		return b, err
	}
	if b.NumSamples > 0 {
		b.BytesPerSample = float64(b.Bytes) / float64(b.NumSamples)
		b.ChunkBytesPerSample = float64(b.ChunkBytes) / float64(b.NumSamples)
	}
	if b.NumSeries > 0 {
		b.IndexBytesPerSeries = float64(b.IndexBytes) / float64(b.NumSeries)
	}
	return b, nil
}
