package gathering

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/phonehome/phonehome/atomicfile"
	"github.com/phonehome/phonehome/auth"
)

// MaxPrevious bounds the versions of one definition accepted server-side
// besides the one in force: those replaced within the grace period, newest
// first. Past it, the oldest is dropped before its grace period ends (with
// a warning): forwarders still on it are refused. It takes more than one
// change per GracePeriod/MaxPrevious (22.5 minutes for 6h) to get there.
const MaxPrevious = 16

// replaced is a definition that was in force until at.
type replaced struct {
	def *Compiled
	at  time.Time
}

// persistedState is a tenant's state file: the definition in force (none
// for a tenant whose own file is no longer configured) and the versions
// it replaced within the grace period, each with when it was replaced.
// Definitions are their canonical JSON bodies, decoded and validated again
// when restored. Previous and ReplacedAt are the format that kept a single
// previous version: read, no longer written.
type persistedState struct {
	Current    json.RawMessage    `json:"current,omitempty"`
	Versions   []persistedVersion `json:"previous_versions,omitempty"` // newest first
	Previous   json.RawMessage    `json:"previous,omitempty"`
	ReplacedAt time.Time          `json:"replaced,omitzero"`
}

type persistedVersion struct {
	Definition json.RawMessage `json:"definition"`
	Replaced   time.Time       `json:"replaced"`
}

// statePath is <dir>/default.json for the default definition and
// <dir>/tenants/<tenant>.json for a tenant's (auth.ValidTenant names are
// safe file names, and cannot collide with the default's).
func statePath(dir, tenant string) string {
	if tenant == DefaultTenant {
		return filepath.Join(dir, "default.json")
	}
	return filepath.Join(dir, "tenants", tenant+".json")
}

// loadState reads the state file at path: the definition that was in
// force (nil if none) and the versions it had replaced. A missing file is
// fs.ErrNotExist.
func loadState(path string) (was *Compiled, prev []replaced, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var ps persistedState
	if err := json.Unmarshal(b, &ps); err != nil {
		return nil, nil, err
	}
	if len(ps.Current) > 0 {
		if was, err = compileJSON(ps.Current); err != nil {
			return nil, nil, fmt.Errorf("current: %w", err)
		}
	}
	if len(ps.Previous) > 0 { // the single-previous format
		ps.Versions = append(ps.Versions, persistedVersion{Definition: ps.Previous, Replaced: ps.ReplacedAt})
	}
	for i, v := range ps.Versions {
		c, err := compileJSON(v.Definition)
		if err != nil {
			return nil, nil, fmt.Errorf("previous_versions[%d]: %w", i, err)
		}
		prev = append(prev, replaced{def: c, at: v.Replaced})
	}
	if was == nil && len(prev) == 0 {
		return nil, nil, errors.New("no definition")
	}
	return was, prev, nil
}

// history returns the versions of src to keep accepting besides cur (nil
// for none), newest first: those of entries still within their grace
// period at now, other than cur, each once (as of its latest
// replacement), at most MaxPrevious — older ones are dropped with a
// warning.
func (s *Server) history(src *source, cur *Compiled, entries []replaced, now time.Time) []replaced {
	sorted := slices.Clone(entries)
	slices.SortStableFunc(sorted, func(a, b replaced) int { return b.at.Compare(a.at) })
	seen := make(map[string]bool, len(sorted)+1)
	if cur != nil {
		seen[cur.ETag] = true
	}
	var out []replaced
	for _, r := range sorted {
		if seen[r.def.ETag] || !now.Before(r.at.Add(s.grace)) {
			continue
		}
		seen[r.def.ETag] = true
		out = append(out, r)
	}
	if len(out) > MaxPrevious {
		for _, r := range out[MaxPrevious:] {
			s.logger.Warn("too many gathering definition versions within the grace period, the oldest is no longer accepted",
				"tenant", src.tenant, "version", r.def.Def.Version, "replaced", r.at.UTC().Format(time.RFC3339), "limit", MaxPrevious)
		}
		out = out[:MaxPrevious:MaxPrevious]
	}
	return out
}

// restore returns src's state with cur, the definition just loaded from
// its file, in force, and the previous versions from its state file (each
// until its own grace period ends), plus:
//   - cur is what was in force before the restart: nothing;
//   - the file changed while the receiver was down: what was in force
//     before, replaced now;
//   - a tenant without a definition of its own before (no state file, or
//     one left when its file was removed from the configuration): its
//     forwarders were served the default until now, so the default's
//     definition, replaced now, and the default's previous versions; the
//     default's own file has nothing before it;
//   - an unusable state file: nothing, and no previous version.
//
// The state file is rewritten whenever it does not describe the result.
func (s *Server) restore(src *source, cur *Compiled) *serverState {
	now := s.now()
	st := &serverState{cur: cur}
	was, prev, err := loadState(src.statePath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.logger.Warn("unusable gathering state, no previous definition", "tenant", src.tenant, "file", src.statePath, "err", err)
		s.persist(src, st)
		return st
	}
	n := len(prev)
	msg, previous := "", ""
	switch {
	case was != nil && was.ETag == cur.ETag: // as before the restart
	case was != nil:
		prev = append(prev, replaced{def: was, at: now})
		msg, previous = "gathering definition changed while stopped", was.Def.Version
	case src.tenant != DefaultTenant && s.def != nil: // NewServer opens the default first
		def := s.def.state.Load()
		prev = append(prev, replaced{def: def.cur, at: now})
		prev = append(prev, def.prev...)
		msg, previous = "tenant has its own gathering definition now; the default's selectors are accepted meanwhile", def.cur.Def.Version
	}
	st.prev = s.history(src, cur, prev, now)
	if msg != "" && len(st.prev) > 0 && st.prev[0].at.Equal(now) {
		s.logger.Info(msg, "tenant", src.tenant, "file", src.path, "version", cur.Def.Version, "previous", previous,
			"previous_accepted_until", now.Add(s.grace).UTC().Format(time.RFC3339), "previous_versions", len(st.prev))
	}
	if was == nil || was.ETag != cur.ETag || len(st.prev) != n {
		s.persist(src, st)
	}
	return st
}

// restoreOrphans returns a source for each tenant with a state file under
// dir but no definition file in configured any more (its file was removed
// from the configuration while the receiver was down): it has no
// definition in force — it is served the default — but its last own one,
// replaced now, and the versions that one replaced stay accepted, each
// until its grace period ends (see Server.Allowlists). Its state file,
// rewritten without a definition in force, keeps them across restarts,
// and is deleted once all have ended (here, or by Reload).
func (s *Server) restoreOrphans(dir string, configured map[string]string) map[string]*source {
	entries, err := os.ReadDir(filepath.Join(dir, "tenants"))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.logger.Warn("read gathering state, no grace period for tenants without a definition of their own any more", "dir", dir, "err", err)
		}
		return nil
	}
	now := s.now()
	out := map[string]*source{}
	for _, e := range entries {
		tenant, ok := strings.CutSuffix(e.Name(), ".json")
		if _, configured := configured[tenant]; !ok || configured || e.IsDir() || !auth.ValidTenant(tenant) {
			continue
		}
		src := &source{tenant: tenant, statePath: statePath(dir, tenant)}
		was, prev, err := loadState(src.statePath)
		if err != nil {
			s.logger.Warn("unusable gathering state of a tenant without a definition of its own, removed", "tenant", tenant, "file", src.statePath, "err", err)
			if err := os.Remove(src.statePath); err != nil {
				s.logger.Error("remove gathering state", "tenant", tenant, "file", src.statePath, "err", err)
			}
			continue
		}
		n := len(prev)
		if was != nil {
			prev = append(prev, replaced{def: was, at: now})
		}
		st := &serverState{prev: s.history(src, nil, prev, now)}
		if len(st.prev) == 0 {
			s.removeState(src)
			continue
		}
		if was != nil {
			s.logger.Info("tenant has no gathering definition of its own any more; its last one is accepted meanwhile", "tenant", tenant,
				"previous", was.Def.Version, "previous_accepted_until", now.Add(s.grace).UTC().Format(time.RFC3339), "previous_versions", len(st.prev))
		}
		if was != nil || len(st.prev) != n {
			s.persist(src, st)
		}
		src.state.Store(st)
		out[tenant] = src
	}
	return out
}

// expire deletes the state file of src, a tenant without a definition of
// its own, once the grace periods of all its versions have ended.
func (s *Server) expire(src *source) {
	src.reloadMu.Lock()
	defer src.reloadMu.Unlock()
	st := src.state.Load()
	if len(st.prev) == 0 || len(s.history(src, nil, st.prev, s.now())) > 0 {
		return
	}
	src.state.Store(&serverState{})
	s.removeState(src)
}

// removeState deletes the state file of src, a tenant without a
// definition of its own whose grace periods have all ended.
func (s *Server) removeState(src *source) {
	if err := os.Remove(src.statePath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.logger.Error("remove gathering state", "tenant", src.tenant, "file", src.statePath, "err", err)
		return
	}
	s.logger.Info("grace period of a tenant without a gathering definition of its own ended, state removed", "tenant", src.tenant, "file", src.statePath)
}

func compileJSON(b []byte) (*Compiled, error) {
	d, err := Decode(b)
	if err != nil {
		return nil, err
	}
	return Compile(d)
}

// persist writes st to src's state file. A failure is logged: the
// definition in force does not depend on it, only the grace period after
// a restart does.
func (s *Server) persist(src *source, st *serverState) {
	if src.statePath == "" {
		return
	}
	var ps persistedState
	if st.cur != nil {
		ps.Current = st.cur.Body
	}
	for _, r := range st.prev {
		ps.Versions = append(ps.Versions, persistedVersion{Definition: r.def.Body, Replaced: r.at.UTC()})
	}
	b, err := json.Marshal(ps)
	if err == nil {
		err = writeFileAtomic(src.statePath, b)
	}
	if err != nil {
		s.logger.Error("persist gathering state", "tenant", src.tenant, "file", src.statePath, "err", err)
	}
}

// writeFileAtomic replaces path with b (see atomicfile.Write), creating its
// directory first: state lives in directories made on first use.
func writeFileAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	return atomicfile.Write(path, b, 0o640)
}
