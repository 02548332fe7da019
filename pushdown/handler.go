package pushdown

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	promstorage "github.com/prometheus/prometheus/storage"
)

// NewHandler serves POST Path: a part of a query evaluated with engine (not
// a pushdown Engine: the answer covers local data only) over local, this
// receiver's own data of the request's tenant. It expects authentication
// in front. ready nil means always ready.
func NewHandler(logger *slog.Logger, engine promql.QueryEngine, local promstorage.Queryable, clusterLabel string, ready func() bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ready != nil && !ready() {
			http.Error(w, "service unavailable", http.StatusServiceUnavailable)
			return
		}
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req, err := DecodeRequest(r.PostForm)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		res, err := Evaluate(r.Context(), engine, local, clusterLabel, req)
		if err != nil {
			http.Error(w, err.Error(), statusOf(err))
			return
		}
		if err := writeResult(w, res); err != nil {
			logger.Debug("write pushdown answer", "err", err)
		}
	})
}

// statusOf maps an evaluation error as Prometheus' API does: 400 for a bad
// query, 503 when cancelled or timed out, 422 otherwise.
func statusOf(err error) int {
	var (
		parseErrs parser.ParseErrors
		timeout   promql.ErrQueryTimeout
		cancelled promql.ErrQueryCanceled
	)
	switch {
	case errors.As(err, &parseErrs):
		return http.StatusBadRequest
	case errors.As(err, &timeout), errors.As(err, &cancelled):
		return http.StatusServiceUnavailable
	}
	return http.StatusUnprocessableEntity
}
