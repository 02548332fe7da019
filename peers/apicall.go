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
// series calls), as ChunkedReadLimit bounds a remote-read frame: a larger
// one is errAnswerTooLarge.
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

// errAnswerTooLarge is an answer beyond maxAPIAnswer.
var errAnswerTooLarge = fmt.Errorf("answer exceeds %d bytes", maxAPIAnswer)

// apiCall is a call to a peer's Prometheus-style API.
type apiCall struct {
	path   string
	params url.Values
	// post sends params as a form (Prometheus' API takes one on its
	// label names and series calls): a GET's URL, whose length the
	// peer's server bounds (431 beyond 1 MB), could not hold a large match[].
	post bool
	// local requires the answer of a handler that serves local scope
	// (scoped), which marks it with InstanceHeader: a 200 without it is
	// an earlier release's query API, whose answer is its fleet view, and
	// is errNoIndexCalls.
	local bool
}

// envelope is the envelope of Prometheus' HTTP API around its data.
type envelope struct {
	Status   string
	Warnings []string
	Infos    []string
}

// callAPI makes c to p through the peer transport (credential, local scope)
// and decodes the answer's envelope, handing its data to decodeData (the
// decoder at the data's value): an answer is never held whole, and is cut
// at maxAPIAnswer (errAnswerTooLarge). An answer other than 200 is a
// *statusError.
func callAPI(ctx context.Context, s *Set, p *peer, c apiCall, decodeData func(*json.Decoder) error) (envelope, error) {
	u := s.cfg.Scheme + "://" + p.addr + c.path
	method, body := http.MethodGet, io.Reader(nil)
	if c.post {
		method, body = http.MethodPost, strings.NewReader(c.params.Encode())
	} else {
		u += "?" + c.params.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return envelope{}, err
	}
	if c.post {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := p.query.Do(req)
	if err != nil {
		return envelope{}, err
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return envelope{}, &statusError{code: resp.StatusCode, msg: fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))}
	}
	if c.local && resp.Header.Get(ScopeHeader) != ScopeLocal {
		return envelope{}, fmt.Errorf("%w: a 200 without %s: %s, the fleet view of an earlier release", errNoIndexEndpoint, ScopeHeader, ScopeLocal)
	}
	if resp.ContentLength > maxAPIAnswer { // not worth reading
		return envelope{}, errAnswerTooLarge
	}
	env, err := decodeEnvelope(json.NewDecoder(&cappedReader{r: resp.Body, n: maxAPIAnswer}), decodeData)
	if err != nil {
		return env, fmt.Errorf("decode answer: %w", err)
	}
	if env.Status != "success" {
		return env, fmt.Errorf("answer status %q", env.Status)
	}
	return env, nil
}

// getAPI GETs path?params from p (callAPI) and decodes its data as T.
func getAPI[T any](ctx context.Context, s *Set, p *peer, path string, params url.Values) (T, envelope, error) {
	var data T
	env, err := callAPI(ctx, s, p, apiCall{path: path, params: params}, func(d *json.Decoder) error { return d.Decode(&data) })
	return data, env, err
}

// decodeEnvelope decodes {"status", "data", "warnings", "infos", ...}
// token by token, handing data to decodeData.
func decodeEnvelope(d *json.Decoder, decodeData func(*json.Decoder) error) (envelope, error) {
	var env envelope
	if err := expectDelim(d, '{'); err != nil {
		return env, err
	}
	for d.More() {
		key, err := d.Token()
		if err != nil {
			return env, err
		}
		switch key {
		case "status":
			err = d.Decode(&env.Status)
		case "data":
			err = decodeData(d)
		case "warnings":
			err = d.Decode(&env.Warnings)
		case "infos":
			err = d.Decode(&env.Infos)
		default: // errorType, error: not in a 200
			err = d.Decode(&json.RawMessage{})
		}
		if err != nil {
			return env, err
		}
	}
	return env, expectDelim(d, '}')
}

func expectDelim(d *json.Decoder, want json.Delim) error {
	tok, err := d.Token()
	if err != nil {
		return err
	}
	if tok != want {
		return fmt.Errorf("got %v, want %v", tok, want)
	}
	return nil
}

// cappedReader reads r up to n bytes, then fails with errAnswerTooLarge
// (io.LimitReader's EOF would be a truncated answer, not a large one).
type cappedReader struct {
	r io.Reader
	n int64
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.n <= 0 {
		return 0, errAnswerTooLarge
	}
	if int64(len(p)) > c.n {
		p = p[:c.n]
	}
	n, err := c.r.Read(p)
	c.n -= int64(n)
	return n, err
}

// annotations are the answer's warnings (truncatedWarning left out) and
// infos, each naming p.
func (e envelope) annotations(p *peer) annotations.Annotations {
	var ws annotations.Annotations
	for _, w := range e.Warnings {
		if w != truncatedWarning {
			ws.Add(fmt.Errorf("peer %s: %s", p.addr, w))
		}
	}
	for _, i := range e.Infos {
		ws.Add(fmt.Errorf("peer %s: %s: %w", p.addr, i, annotations.PromQLInfo))
	}
	return ws
}

// errNoIndexCalls means a peer's index endpoint cannot answer a label or
// series call in local scope to this replica, and the querier reads the
// peer's series over remote read instead. Either the peer does not serve
// the call (errNoIndexEndpoint), or this call is too large for it
// (errIndexCallTooLarge).
var errNoIndexCalls = errors.New("peer cannot answer this call from its index")

// errNoIndexEndpoint: the peer refused the call as a receiver of an
// earlier release does (which has no such endpoint for peers): 404 or
// 405, or 401 or 403 (it does not take the replica token there); or it
// answered from its query API (apiCall.local). If the credential is really
// wrong, the remote read fails too and is the warning.
var errNoIndexEndpoint = fmt.Errorf("%w: no local-scope endpoint for this call", errNoIndexCalls)

// errIndexCallTooLarge: the call's URL is over the peer server's limit
// (414 or 431: label values, which Prometheus serves on GET only, with a
// large match[]), which remote read does not have. An answer over
// maxAPIAnswer is not one: remote read would read at least as much, with
// no bound at all; it stays a warning.
var errIndexCallTooLarge = fmt.Errorf("%w: too large for an index call", errNoIndexCalls)

// refused classifies err, an index call's: errNoIndexEndpoint or
// errIndexCallTooLarge where one applies, else err.
func refused(err error) error {
	var se *statusError
	switch {
	case errors.As(err, &se) && (se.code == http.StatusNotFound || se.code == http.StatusMethodNotAllowed ||
		se.code == http.StatusUnauthorized || se.code == http.StatusForbidden):
		return fmt.Errorf("%w: %w", errNoIndexEndpoint, err)
	case errors.As(err, &se) && (se.code == http.StatusRequestURITooLong || se.code == http.StatusRequestHeaderFieldsTooLarge):
		return fmt.Errorf("%w: %w", errIndexCallTooLarge, err)
	}
	return err
}

// scoped serves a request with ScopeHeader "local" — a peer's — with
// local, so that peers never recurse, and any other with fleet. Every
// answer carries InstanceHeader; a local one also ScopeHeader: local, which
// tells the caller it is not an earlier release's fleet view (callAPI).
func (s *Set) scoped(local, fleet http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(InstanceHeader, s.instance)
		if r.Header.Get(ScopeHeader) == ScopeLocal {
			w.Header().Set(ScopeHeader, ScopeLocal)
			local.ServeHTTP(w, r)
			return
		}
		fleet.ServeHTTP(w, r)
	})
}
