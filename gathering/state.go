package gathering

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
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
// for a definition no longer configured) and the versions it replaced
// within the grace period, each with when it was replaced. Definitions are their canonical JSON bodies, decoded and
// validated again when restored. Previous and ReplacedAt are the format
// that kept a single previous version: read, no longer written.
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

// savedState is a state file as read back.
type savedState struct {
	was  *Compiled // the definition in force before the restart; nil if none
	prev []replaced
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

// removeStaleState removes the temporary state files that a process
// killed while writing them left under dir (the default's, the tenants').
func removeStaleState(logger *slog.Logger, dir string) error {
	return errors.Join(
		atomicfile.RemoveStale(logger, statePath(dir, DefaultTenant)),
		atomicfile.RemoveStaleIn(logger, filepath.Join(dir, "tenants"), ".json"),
	)
}

// HasState reports whether dir, a ServerOptions.StateDir, holds the state
// of any definition: a receiver configured without definition files still
// needs a Server then, for the grace periods of the ones removed.
func HasState(dir string) bool {
	if _, err := os.Stat(statePath(dir, DefaultTenant)); err == nil {
		return true
	}
	tenants, _ := filepath.Glob(filepath.Join(dir, "tenants", "*.json"))
	return len(tenants) > 0
}

// loadState reads the state file at path. A missing file is
// fs.ErrNotExist.
func loadState(path string) (savedState, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return savedState{}, err
	}
	var ps persistedState
	if err := json.Unmarshal(b, &ps); err != nil {
		return savedState{}, err
	}
	var ss savedState
	if len(ps.Current) > 0 {
		if ss.was, err = compileJSON(ps.Current); err != nil {
			return savedState{}, fmt.Errorf("current: %w", err)
		}
	}
	if len(ps.Previous) > 0 { // the single-previous format
		ps.Versions = append(ps.Versions, persistedVersion{Definition: ps.Previous, Replaced: ps.ReplacedAt})
	}
	for i, v := range ps.Versions {
		c, err := compileJSON(v.Definition)
		if err != nil {
			return savedState{}, fmt.Errorf("previous_versions[%d]: %w", i, err)
		}
		ss.prev = append(ss.prev, replaced{def: c, at: v.Replaced})
	}
	if ss.was == nil && len(ss.prev) == 0 {
		return savedState{}, errors.New("no definition")
	}
	return ss, nil
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
// What was replaced while the receiver was down counts as replaced at
// start, however long ago the state file was written: forwarders cannot
// poll a stopped receiver, so those it served are still on what it
// served, and a backlog they gathered with it arrives after the start.
//
// The state file is rewritten: cur is served from now on.
func (s *Server) restore(src *source, cur *Compiled) *serverState {
	now := s.now()
	st := &serverState{cur: cur}
	saved, err := loadState(src.statePath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.logger.Warn("unusable gathering state, no previous definition", "tenant", src.tenant, "file", src.statePath, "err", err)
		s.persist(src, st)
		return st
	}
	prev := saved.prev
	var last replaced // what the forwarders were served before, if not cur
	msg := ""
	switch {
	case saved.was != nil && saved.was.ETag == cur.ETag: // as before the restart
	case saved.was != nil:
		last = replaced{def: saved.was, at: now}
		prev = append(prev, last)
		msg = "gathering definition changed while stopped"
	case src.tenant != DefaultTenant && s.def != nil: // NewServer opens the default first
		def := s.def.state.Load()
		if def.cur != nil {
			last = replaced{def: def.cur, at: now}
			prev = append(prev, last)
		}
		prev = append(prev, def.prev...)
		msg = "tenant has its own gathering definition now; the default's selectors are accepted meanwhile"
	}
	st.prev = s.history(src, cur, prev, now)
	if until := last.at.Add(s.grace); last.def != nil && now.Before(until) {
		s.logger.Info(msg, "tenant", src.tenant, "file", src.path, "version", cur.Def.Version, "previous", last.def.Def.Version,
			"previous_accepted_until", until.UTC().Format(time.RFC3339), "previous_versions", len(st.prev))
	}
	s.persist(src, st)
	return st
}

// restoreOrphans returns a source for each tenant with a state file under
// dir but no definition file in configured any more (see restoreOrphan).
func (s *Server) restoreOrphans(dir string, configured map[string]string) map[string]*source {
	entries, err := os.ReadDir(filepath.Join(dir, "tenants"))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.logger.Warn("read gathering state, no grace period for tenants without a definition of their own any more", "dir", dir, "err", err)
		}
		return nil
	}
	out := map[string]*source{}
	for _, e := range entries {
		tenant, ok := strings.CutSuffix(e.Name(), ".json")
		if _, configured := configured[tenant]; !ok || configured || e.IsDir() || !auth.ValidTenant(tenant) {
			continue
		}
		if src := s.restoreOrphan(dir, tenant); src != nil {
			out[tenant] = src
		}
	}
	return out
}

// restoreOrphan returns the source of tenant (or of the default), whose
// definition file is no longer configured (removed while the receiver was
// down), from its state file under dir, or nil if nothing of it is still
// within its grace period. It has no definition in force — a tenant is
// served the default, the default's tenants nothing (404) — but its last
// definition, replaced at start (see restore), and the
// versions that one replaced stay accepted, each until its grace period
// ends (see Server.Allowlists). Its state file, rewritten without a
// definition in force, keeps them across restarts, and is deleted once
// all have ended (here, or by Reload).
func (s *Server) restoreOrphan(dir, tenant string) *source {
	src := &source{tenant: tenant, statePath: statePath(dir, tenant)}
	saved, err := loadState(src.statePath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		s.logger.Warn("unusable gathering state of a definition no longer configured, removed", "tenant", tenant, "file", src.statePath, "err", err)
		if err := os.Remove(src.statePath); err != nil {
			s.logger.Error("remove gathering state", "tenant", tenant, "file", src.statePath, "err", err)
		}
		return nil
	}
	now := s.now()
	prev := saved.prev
	if saved.was != nil {
		prev = append(prev, replaced{def: saved.was, at: now})
	}
	st := &serverState{prev: s.history(src, nil, prev, now)}
	if len(st.prev) == 0 {
		s.removeState(src)
		return nil
	}
	if until := now.Add(s.grace); saved.was != nil && now.Before(until) {
		msg := "tenant has no gathering definition of its own any more; its last one is accepted meanwhile"
		if tenant == DefaultTenant {
			msg = "no default gathering definition any more; its last one is accepted meanwhile"
		}
		s.logger.Info(msg, "tenant", tenant, "previous", saved.was.Def.Version,
			"previous_accepted_until", until.UTC().Format(time.RFC3339), "previous_versions", len(st.prev))
	}
	if saved.was != nil || len(st.prev) != len(saved.prev) {
		s.persist(src, st)
	}
	src.state.Store(st)
	return src
}

// expire deletes the state file of src, a definition no longer
// configured, once the grace periods of all its versions have ended, and
// reports whether it did.
func (s *Server) expire(src *source) bool {
	src.reloadMu.Lock()
	defer src.reloadMu.Unlock()
	st := src.state.Load()
	if len(st.prev) == 0 || len(s.history(src, nil, st.prev, s.now())) > 0 {
		return false
	}
	src.state.Store(&serverState{})
	s.removeState(src)
	return true
}

// removeState deletes the state file of src, a definition no longer
// configured whose grace periods have all ended.
func (s *Server) removeState(src *source) {
	if err := os.Remove(src.statePath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.logger.Error("remove gathering state", "tenant", src.tenant, "file", src.statePath, "err", err)
		return
	}
	s.logger.Info("grace period of a gathering definition no longer configured ended, state removed", "tenant", src.tenant, "file", src.statePath)
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
