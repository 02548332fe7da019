package status

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"github.com/phonehome/phonehome/atomicfile"
)

// saveInterval is how often the history is written to Options.HistoryFile
// (and once more at shutdown): a crash loses at most that much of the chart.
const saveInterval = 10 * time.Minute

// historyFileVersion is the format of the file; another one is ignored.
const historyFileVersion = 1

type historyFile struct {
	Version int                     `json:"version"`
	Tenants map[string][]pointJSONv `json:"tenants"`
}

// pointJSONv is a point on disk. Refusals are by reason name, so that a
// receiver with more (or other) reasons reads an older file correctly.
type pointJSONv struct {
	T         int64             `json:"t"`   // Unix milliseconds
	Run       int64             `json:"run"` // the recording process (its start, Unix nanoseconds)
	Samples   uint64            `json:"samples"`
	Refused   map[string]uint64 `json:"refused,omitempty"`
	Reporting int               `json:"reporting"`
}

// save writes every tenant's history to the history file, if any.
func (s *Status) save() error {
	if s.opts.HistoryFile == "" {
		return nil
	}
	reasons := s.opts.Limiter.Reasons()
	f := historyFile{Version: historyFileVersion, Tenants: map[string][]pointJSONv{}}
	s.mu.Lock()
	for tenant, h := range s.history {
		ps := h.since(time.Time{})
		out := make([]pointJSONv, 0, len(ps))
		for _, p := range ps {
			pj := pointJSONv{T: p.t.UnixMilli(), Run: p.run, Samples: p.samples, Reporting: p.reporting}
			for i, n := range p.refused {
				if n > 0 && i < len(reasons) {
					if pj.Refused == nil {
						pj.Refused = map[string]uint64{}
					}
					pj.Refused[reasons[i]] = n
				}
			}
			out = append(out, pj)
		}
		f.Tenants[tenant] = out
	}
	s.mu.Unlock()
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.opts.HistoryFile), 0o750); err != nil {
		return err
	}
	return atomicfile.Write(s.opts.HistoryFile, b, 0o600)
}

// load reads the history file written by an earlier run, keeping the last
// day. A missing file is no error: the first start, or no history yet.
func (s *Status) load() error {
	if s.opts.HistoryFile == "" {
		return nil
	}
	if err := atomicfile.RemoveStale(s.logger, s.opts.HistoryFile); err != nil { // litter only: the history still loads
		s.logger.Warn("remove temporary status history files", "err", err)
	}
	var f historyFile
	if found, err := readVersioned(s.opts.HistoryFile, 0, &f, &f.Version, historyFileVersion); !found || err != nil {
		return err
	}
	reasons := s.opts.Limiter.Reasons()
	oldest := s.opts.Now().Add(-historyPoints * time.Minute)
	s.mu.Lock()
	defer s.mu.Unlock()
	for tenant, ps := range f.Tenants {
		h := &history{}
		for _, pj := range ps {
			t := time.UnixMilli(pj.T)
			if t.Before(oldest) || pj.Run == s.run {
				continue
			}
			p := point{t: t, run: pj.Run, samples: pj.Samples, reporting: pj.Reporting, refused: make([]uint64, len(reasons))}
			for i, r := range reasons {
				p.refused[i] = pj.Refused[r]
			}
			h.add(p)
		}
		if h.n > 0 {
			s.history[tenant] = h
		}
	}
	return nil
}
