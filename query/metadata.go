package query

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/util/annotations"
	"github.com/prometheus/prometheus/util/httputil"
	v1 "github.com/prometheus/prometheus/web/api/v1"

	"github.com/phonehome/phonehome/auth"
)

// MetadataQuery is what /api/v1/metadata asks for, with Prometheus'
// semantics.
type MetadataQuery struct {
	// Metric selects one metric family; "" means all.
	Metric string
	// Limit bounds the families returned; negative means no bound (and 0
	// returns none, as in Prometheus).
	Limit int
	// LimitPerMetric bounds the metadata returned per family; 0 or
	// negative means no bound.
	LimitPerMetric int
}

// Values encodes q as the API's parameters.
func (q MetadataQuery) Values() url.Values {
	return url.Values{
		"metric":           {q.Metric},
		"limit":            {strconv.Itoa(q.Limit)},
		"limit_per_metric": {strconv.Itoa(q.LimitPerMetric)},
	}
}

// MetadataReader returns a tenant's metric metadata by metric family, as q
// selects it. Warnings name what is missing from a partial answer (a peer
// that did not answer); an error fails the request.
type MetadataReader interface {
	Metadata(ctx context.Context, tenant string, q MetadataQuery) (map[string][]metadata.Metadata, annotations.Annotations, error)
}

// MetadataIndex is a receiver's own metadata: family → distinct metadata,
// one family (metric) or all (""), at most limit families when limit >= 0.
// *storage.DB implements it.
type MetadataIndex interface {
	Metadata(tenant, metric string, limit int) (map[string][]metadata.Metadata, error)
}

// LocalMetadata reads this receiver's own metadata index.
func LocalMetadata(ix MetadataIndex) MetadataReader { return localMetadata{ix} }

type localMetadata struct{ ix MetadataIndex }

func (l localMetadata) Metadata(_ context.Context, tenant string, q MetadataQuery) (map[string][]metadata.Metadata, annotations.Annotations, error) {
	// All families: the index picks an arbitrary subset under a limit,
	// MergeMetadata the first by name, which is what makes a limit exact
	// when it is applied again to the merge of several answers.
	m, err := l.ix.Metadata(tenant, q.Metric, -1)
	if err != nil {
		return nil, nil, err
	}
	return MergeMetadata(q, m), nil, nil
}

// MergeMetadata merges answers for q, earlier first: per family, the
// distinct metadata in order of appearance, at most q.LimitPerMetric of
// them; at most q.Limit families, the first by name. Only q.Metric's family
// is kept when it is set. As each answer holds the first q.Limit families
// of its own, the merge holds the first q.Limit of their union.
func MergeMetadata(q MetadataQuery, answers ...map[string][]metadata.Metadata) map[string][]metadata.Metadata {
	merged := map[string][]metadata.Metadata{}
	for _, a := range answers {
		for fam, ms := range a {
			if q.Metric != "" && fam != q.Metric {
				continue
			}
			out, ok := merged[fam]
			if !ok {
				out = []metadata.Metadata{}
			}
			for _, m := range ms {
				if q.LimitPerMetric > 0 && len(out) >= q.LimitPerMetric {
					break
				}
				if !slices.Contains(out, m) {
					out = append(out, m)
				}
			}
			merged[fam] = out
		}
	}
	if q.Limit < 0 || len(merged) <= q.Limit {
		return merged
	}
	fams := make([]string, 0, len(merged))
	for fam := range merged {
		fams = append(fams, fam)
	}
	slices.Sort(fams)
	for _, fam := range fams[q.Limit:] {
		delete(merged, fam)
	}
	return merged
}

// NewMetadataHandler serves GET /api/v1/metadata from r for the tenant of
// the request (auth.Middleware in front), with Prometheus' parameters,
// errors and JSON, and r's warnings in "warnings". ready nil means always.
func NewMetadataHandler(r MetadataReader, ready func() bool) http.Handler {
	h := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if ready != nil && !ready() {
			http.Error(w, "service unavailable", http.StatusServiceUnavailable)
			return
		}
		q, err := parseMetadataQuery(req)
		if err != nil {
			respond(w, http.StatusBadRequest, v1.Response{Status: "error", ErrorType: "bad_data", Error: err.Error()})
			return
		}
		id, ok := auth.FromContext(req.Context())
		if !ok || id.Tenant == "" {
			respond(w, http.StatusInternalServerError, v1.Response{Status: "error", ErrorType: "internal", Error: errNoTenant.Error()})
			return
		}
		data, ws, err := r.Metadata(req.Context(), id.Tenant, q)
		if err != nil { // this receiver's own metadata: only when it is closing
			respond(w, http.StatusServiceUnavailable, v1.Response{Status: "error", ErrorType: "unavailable", Error: err.Error()})
			return
		}
		warn, info := ws.AsStrings("", 10, 10)
		respond(w, http.StatusOK, v1.Response{Status: "success", Data: data, Warnings: warn, Infos: info})
	})
	return httputil.CompressionHandler{Handler: h} // as Prometheus' API
}

func parseMetadataQuery(r *http.Request) (MetadataQuery, error) {
	q := MetadataQuery{Metric: r.FormValue("metric"), Limit: -1, LimitPerMetric: -1}
	for _, p := range []struct {
		name string
		v    *int
	}{{"limit", &q.Limit}, {"limit_per_metric", &q.LimitPerMetric}} {
		if s := r.FormValue(p.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil {
				return q, errors.New(p.name + " must be a number")
			}
			*p.v = n
		}
	}
	return q, nil
}

func respond(w http.ResponseWriter, code int, resp v1.Response) {
	b, err := json.Marshal(resp)
	if err != nil { // metadata is strings only
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
