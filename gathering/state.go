package gathering

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/phonehome/phonehome/atomicfile"
)

// persistedState is a tenant's state file: the definition in force, the
// one it replaced (if any) and when. Definitions are their canonical JSON
// bodies, decoded and validated again when restored.
type persistedState struct {
	Current  json.RawMessage `json:"current"`
	Previous json.RawMessage `json:"previous,omitempty"`
	Replaced time.Time       `json:"replaced,omitzero"`
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

// restore returns src's state with cur, the definition just loaded from
// its file, in force, and the previous definition from its state file:
//   - cur is what was in force before the restart: the previous
//     definition and its replacement time are restored as they were;
//   - the file changed while the receiver was down: what was in force
//     before becomes the previous definition, replaced now;
//   - no state file: a tenant's own definition is new, and its forwarders
//     were served the default until now, so the default's definition is
//     the previous one, replaced now; the default's own has no previous;
//   - an unusable state file: there is no previous definition.
//
// The state file is rewritten whenever it does not describe the result.
func (s *Server) restore(src *source, cur *Compiled) *serverState {
	st := &serverState{cur: cur}
	b, err := os.ReadFile(src.statePath)
	if errors.Is(err, fs.ErrNotExist) {
		if src.tenant != DefaultTenant && s.def != nil { // NewServer opens the default first
			if def := s.def.state.Load().cur; def.ETag != cur.ETag {
				st.prev, st.changed = def, s.now()
				s.logger.Info("tenant has its own gathering definition now; the default's selectors are accepted meanwhile", "tenant", src.tenant,
					"file", src.path, "version", cur.Def.Version, "previous", def.Def.Version,
					"previous_accepted_until", st.changed.Add(s.grace).UTC().Format(time.RFC3339))
			}
		}
		s.persist(src, st)
		return st
	}
	var ps persistedState
	var was, prev *Compiled
	if err == nil {
		err = json.Unmarshal(b, &ps)
	}
	if err == nil {
		was, err = compileJSON(ps.Current)
	}
	if err == nil && len(ps.Previous) > 0 {
		prev, err = compileJSON(ps.Previous)
	}
	if err != nil {
		s.logger.Warn("unusable gathering state, no previous definition", "tenant", src.tenant, "file", src.statePath, "err", err)
		s.persist(src, st)
		return st
	}
	if was.ETag == cur.ETag {
		if prev != nil {
			st.prev, st.changed = prev, ps.Replaced
		}
		return st
	}
	st.prev, st.changed = was, s.now()
	s.logger.Info("gathering definition changed while stopped", "tenant", src.tenant, "file", src.path,
		"version", cur.Def.Version, "previous", was.Def.Version,
		"previous_accepted_until", st.changed.Add(s.grace).UTC().Format(time.RFC3339))
	s.persist(src, st)
	return st
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
	ps := persistedState{Current: st.cur.Body}
	if st.prev != nil {
		ps.Previous, ps.Replaced = st.prev.Body, st.changed.UTC()
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
