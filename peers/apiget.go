package peers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/prometheus/prometheus/util/annotations"
)

// maxAPIAnswer bounds a peer's answer to an API call (metadata, label and
// series calls), as ChunkedReadLimit bounds a remote-read frame; a larger
// one is a failed peer.
const maxAPIAnswer = 50 << 20

// truncatedWarning is the warning Prometheus' label and series handlers add
// when they cut an answer at limit. A peer's is not passed on: the querier
// asks it for the caller's limit, and the API that asked warns itself if the
// merge is over its own.
const truncatedWarning = "results truncated due to limit"

// statusError is a peer's answer other than 200.
type statusError struct {
	code int
	msg  string
}

func (e *statusError) Error() string { return e.msg }

// apiAnswer is the envelope of Prometheus' HTTP API, data decoded by the
// caller's type.
type apiAnswer[T any] struct {
	Status   string   `json:"status"`
	Data     T        `json:"data"`
	Warnings []string `json:"warnings"`
	Infos    []string `json:"infos"`
}

// getAPI GETs path?params from p, through the peer transport (credential,
// local scope), and decodes its API envelope; an answer that is not 200
// is a *statusError.
func getAPI[T any](ctx context.Context, s *Set, p *peer, path string, params url.Values) (apiAnswer[T], error) {
	var out apiAnswer[T]
	u := s.cfg.Scheme + "://" + p.addr + path + "?" + params.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return out, err
	}
	resp, err := p.query.Do(req)
	if err != nil {
		return out, err
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return out, &statusError{code: resp.StatusCode, msg: fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAPIAnswer+1))
	if err != nil {
		return out, err
	}
	if len(body) > maxAPIAnswer {
		return out, fmt.Errorf("answer exceeds %d bytes", maxAPIAnswer)
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return out, fmt.Errorf("decode answer: %w", err)
	}
	if out.Status != "success" {
		return out, fmt.Errorf("answer status %q", out.Status)
	}
	return out, nil
}

// annotations are the answer's warnings (truncatedWarning left out) and
// infos, each naming p.
func (a apiAnswer[T]) annotations(p *peer) annotations.Annotations {
	var ws annotations.Annotations
	for _, w := range a.Warnings {
		if w != truncatedWarning {
			ws.Add(fmt.Errorf("peer %s: %s", p.addr, w))
		}
	}
	for _, i := range a.Infos {
		ws.Add(fmt.Errorf("peer %s: %s: %w", p.addr, i, annotations.PromQLInfo))
	}
	return ws
}

// errNoIndexCalls means a peer refused a label or series call in local
// scope to this replica in a way a receiver of an earlier release does
// (which has no such endpoint for peers): 404 or 405, or 401 or 403 (it
// does not take the replica token there). The querier then reads the
// peer's series over remote read instead; if the credential is really
// wrong, that read fails too and is the warning.
var errNoIndexCalls = errors.New("peer has no local-scope endpoint for this call")

// refused returns err as errNoIndexCalls if it is such a refusal.
func refused(err error) error {
	var se *statusError
	if errors.As(err, &se) {
		switch se.code {
		case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%w: %w", errNoIndexCalls, err)
		}
	}
	return err
}

// scoped serves a request with ScopeHeader "local" — a peer's — with
// local, so that peers never recurse, and any other with fleet. Every
// answer carries InstanceHeader.
func (s *Set) scoped(local, fleet http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(InstanceHeader, s.instance)
		if r.Header.Get(ScopeHeader) == ScopeLocal {
			local.ServeHTTP(w, r)
			return
		}
		fleet.ServeHTTP(w, r)
	})
}
