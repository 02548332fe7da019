package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// webhookStatusError is an answer of the authorize webhook other than 200,
// 401 and 403. Only those two refuse, so the client gets 503 and retries
// (ErrUpstream), as documented; but the webhook did answer, and its answer
// is often a contract mismatch (a registry's 404 for an unknown cluster),
// not an outage, so the message says what it answered rather than
// ErrUpstream's "unavailable".
type webhookStatusError struct{ code int }

func (e *webhookStatusError) Error() string {
	return fmt.Sprintf("webhook answered %d, not 200/401/403", e.code)
}

// Unwrap makes the answer ErrUpstream: 503 with Retry-After to the client.
func (e *webhookStatusError) Unwrap() error { return ErrUpstream }

// hint says what to change on the webhook's side, for the log.
func (e *webhookStatusError) hint() string {
	switch {
	case e.code == http.StatusTooManyRequests:
		return "the webhook throttles the receiver; the client retries after 30s"
	case e.code >= 400 && e.code < 500:
		return fmt.Sprintf("a %d is not a refusal and the client retries it for ever: have the webhook answer 403 for an unknown or refused cluster, 401 for an unknown token", e.code)
	case e.code >= 300 && e.code < 400:
		return "redirects are not followed (the fleet token would go wherever they point): set auth.authorize_webhook.url to the final URL"
	default:
		return "the webhook failed: see its logs"
	}
}

// upstreamWarnEvery is how often /authorize and Telemeter's write path
// each log, at Warn, a fleet authorizer that did not answer 200, 401 or
// 403; the others go to Debug.
// Every cluster it fails for retries about once a minute, so a line per
// request would flood the log (phonehome_auth_authorize_requests_total{
// result="upstream_error"} counts them all).
const upstreamWarnEvery = time.Minute

// logThrottle lets one log line through per interval and counts the others.
type logThrottle struct {
	mu   sync.Mutex
	next time.Time
	held int // lines not let through since the last one
}

// allow reports whether a line may be logged at now, and how many were
// held back before it (then reset).
func (t *logThrottle) allow(now time.Time, every time.Duration) (held int, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now.Before(t.next) {
		t.held++
		return 0, false
	}
	held, t.held, t.next = t.held, 0, now.Add(every)
	return held, true
}

// upstreamLog logs a fleet authorizer that gave no answer the client could
// be given (ErrUpstream, answered 503), at Warn once per upstreamWarnEvery,
// else at Debug. It names the cluster by its stored id only when that is a
// pseudonym, never by a raw id, and never quotes the token. The tenant is
// not known: only the webhook's 200 names it. A nil logger logs nothing.
type upstreamLog struct {
	logger *slog.Logger
	now    func() time.Time
	// throttle keeps authorizer failures, one per retrying cluster, from
	// flooding the log.
	throttle logThrottle
}

func (u *upstreamLog) log(ctx context.Context, err error, cluster ClusterIDs) {
	if u.logger == nil {
		return
	}
	level := slog.LevelDebug
	held, ok := u.throttle.allow(u.now(), upstreamWarnEvery)
	if ok {
		level = slog.LevelWarn
	}
	attrs := []any{"err", err, "answered", http.StatusServiceUnavailable}
	if pseudonymRE.MatchString(cluster.Stored) {
		attrs = append(attrs, "cluster_id", cluster.Stored)
	}
	if ok && held > 0 {
		attrs = append(attrs, "not_logged_before", held)
	}
	var ws *webhookStatusError
	if errors.As(err, &ws) {
		attrs = append(attrs, "hint", ws.hint())
		u.logger.Log(ctx, level, "authorize webhook answered neither 200 nor a refusal (401, 403)", attrs...)
		return
	}
	u.logger.Log(ctx, level, "upstream authorizer failed", attrs...)
}
