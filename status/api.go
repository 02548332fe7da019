package status

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	promstorage "github.com/prometheus/prometheus/storage"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/limits"
)

// Errors a caller can cause; everything else is a 500.
var (
	errBadRequest = errors.New("bad request")
	errForbidden  = errors.New("forbidden")
	errNotFound   = errors.New("not found")
)

// source is where a figure comes from, so the page can link to it and
// never disagrees with Grafana: a PromQL expression over the fleet's data,
// or a series of the receiver's /metrics.
type source struct {
	PromQL string `json:"promql,omitempty"`
	Metric string `json:"metric,omitempty"`
}

func (s *Status) route(pattern, name string, h func(*http.Request, string) (any, error)) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		tenant, err := s.tenantOf(r)
		var data any
		if err == nil {
			data, err = h(r, tenant)
		}
		code := http.StatusOK
		body := map[string]any{"status": "success", "data": data}
		if err != nil {
			code = http.StatusInternalServerError
			kind := "internal"
			switch {
			case errors.Is(err, errBadRequest):
				code, kind = http.StatusBadRequest, "bad_data"
			case errors.Is(err, errForbidden):
				code, kind = http.StatusForbidden, "forbidden"
			case errors.Is(err, errNotFound):
				code, kind = http.StatusNotFound, "not_found"
			default:
				s.logger.Error("status API", "endpoint", name, "err", err)
			}
			body = map[string]any{"status": "error", "errorType": kind, "error": err.Error()}
		}
		s.requests.WithLabelValues(name, strconv.Itoa(code)).Inc()
		hdr := w.Header()
		hdr.Set("Content-Type", "application/json")
		hdr.Set("Cache-Control", "no-store")
		hdr.Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	})
}

// tenantOf returns the tenant a request may see: its credential's, or,
// with the fleet_status permission, the one named by ?tenant=. It needs
// read, admin or fleet_status: cluster credentials may only write. A
// tenant's admin credential stays in its tenant, as in the erasure API.
func (s *Status) tenantOf(r *http.Request) (string, error) {
	id, ok := auth.FromContext(r.Context())
	if !ok {
		return "", errors.New("request reached the status API without an identity")
	}
	if id.Allow&(auth.PermRead|auth.PermAdmin|auth.PermFleetStatus) == 0 {
		return "", fmt.Errorf("this credential may not read: %w", errForbidden)
	}
	want := r.URL.Query().Get("tenant")
	switch {
	case want == "" || want == id.Tenant:
		return id.Tenant, nil
	case id.Allow&auth.PermFleetStatus == 0:
		return "", fmt.Errorf("tenant %q: only a credential with fleet_status may read another tenant: %w", want, errForbidden)
	case !auth.ValidTenant(want):
		return "", fmt.Errorf("tenant %q is not a valid tenant name: %w", want, errBadRequest)
	}
	return want, nil
}

func (s *Status) tenants(r *http.Request, tenant string) (any, error) {
	id, _ := auth.FromContext(r.Context())
	names := []string{tenant}
	fleet := id.Allow&auth.PermFleetStatus != 0
	if fleet {
		names = append(names, s.opts.Limiter.Tenants()...)
		if s.opts.Tenants != nil {
			names = append(names, s.opts.Tenants()...)
		}
		slices.Sort(names)
		names = slices.Compact(names)
	}
	return map[string]any{"tenants": names, "current": tenant, "fleet_status": fleet}, nil
}

// figure is a number and where it comes from.
type figure struct {
	Value  float64 `json:"value"`
	Limit  float64 `json:"limit,omitempty"` // 0: none
	Source source  `json:"source"`
	// For a rate: the seconds it is averaged over, and whether that is
	// only the elapsed part of the first window (limits.Rate).
	WindowSeconds float64 `json:"window_seconds,omitempty"`
	Partial       bool    `json:"partial,omitempty"`
}

// rateQuery is the PromQL of a samples/s figure of the series sel over span.
func rateQuery(sel string, span time.Duration) string {
	span = max(span.Round(time.Second), time.Second)
	return fmt.Sprintf("sum(count_over_time(%s[%s])) / %g", sel, promDuration(span), span.Seconds())
}

func (s *Status) overview(r *http.Request, tenant string) (any, error) {
	q := r.URL.Query()
	silent := s.silentAfter()
	if v := q.Get("silent_intervals"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return nil, fmt.Errorf("silent_intervals %q: want an integer from 1 to 1000: %w", v, errBadRequest)
		}
		silent = time.Duration(n) * s.opts.Interval
	}
	l := s.opts.Limiter
	now := s.opts.Now()
	ts, _ := l.Tenant(tenant)
	seen := l.ClustersSeen(tenant, now.Add(-s.reportingWindow()), now.Add(-time.Hour), now.Add(-24*time.Hour), now.Add(-silent), now.Add(-limits.ClusterRetention))
	lim := ts.Limits
	sel := `{_id!=""}`
	out := map[string]any{
		"tenant":               tenant,
		"time":                 now.Unix(),
		"interval_seconds":     s.opts.Interval.Seconds(),
		"silent_after_seconds": silent.Seconds(),
		"clusters": map[string]figure{
			"reporting": {Value: float64(seen[0]), Source: source{PromQL: fmt.Sprintf(`count(count by (_id) (count_over_time(%s[%s])))`, sel, promDuration(s.reportingWindow()))}},
			"last_1h":   {Value: float64(seen[1]), Source: source{PromQL: fmt.Sprintf(`count(count by (_id) (count_over_time(%s[1h])))`, sel)}},
			"last_24h":  {Value: float64(seen[2]), Source: source{PromQL: fmt.Sprintf(`count(count by (_id) (count_over_time(%s[24h])))`, sel)}},
			"silent":    {Value: float64(seen[4] - seen[3])},
			"known":     {Value: float64(seen[4])},
		},
		"series":                   figure{Value: float64(ts.Series), Limit: float64(lim.MaxSeriesPerTenant), Source: source{PromQL: `count({__name__=~".+"})`, Metric: "phonehome_limits_tracked_series"}},
		"series_limit_per_cluster": lim.MaxSeriesPerCluster,
		"samples_per_second": figure{Value: finite(ts.Rate.Value), Limit: finite(lim.SamplesPerSecondPerTenant),
			WindowSeconds: ts.Rate.Span.Seconds(), Partial: ts.Rate.Partial,
			Source: source{PromQL: rateQuery(`{__name__=~".+"}`, ts.Rate.Span)}},
		"samples_per_second_limit_per_cluster": finite(lim.SamplesPerSecondPerCluster),
		"refused_last_hour":                    s.refusedSince(tenant, now.Add(-time.Hour), ts.Refused),
		"refused_total":                        ts.Refused,
		"refused_source":                       source{Metric: "phonehome_receive_rejected_samples_total", PromQL: `sum by (reason) (increase(phonehome_receive_rejected_samples_total[1h]))`},
		"storage":                              s.storage(tenant),
	}
	def := ""
	if s.opts.Definition != nil {
		def = s.opts.Definition(tenant)
	}
	versions := map[string]int{}
	forwarders := map[string]int{}
	protos := map[string]int{}
	for _, c := range l.Clusters(tenant) {
		if c.LastSeen.Before(now.Add(-24 * time.Hour)) {
			continue
		}
		proto, client, d := c.Client()
		versions[d]++
		forwarders[client]++
		protos[proto]++
	}
	out["gathering"] = map[string]any{
		"in_force":            def,
		"clusters_by_version": versions,
		"source":              source{PromQL: `count by (version) (phonehome_gathering_definition_info)`, Metric: "phonehome_gathering_definition_info"},
	}
	out["clients"] = forwarders
	out["protocols"] = protos
	return out, nil
}

// storage reads the tenant's WAL and head figures and the bucket's from
// the receiver's registry.
func (s *Status) storage(tenant string) map[string]figure {
	out := map[string]figure{}
	if s.opts.Gatherer == nil {
		return out
	}
	mfs, err := s.opts.Gatherer.Gather()
	if err != nil && len(mfs) == 0 {
		s.logger.Warn("gather own metrics", "err", err)
		return out
	}
	want := map[string]struct {
		key       string
		perTenant bool
	}{
		"prometheus_tsdb_wal_storage_size_bytes":         {"wal_bytes", true},
		"prometheus_tsdb_head_series":                    {"head_series", true},
		"prometheus_tsdb_head_chunks_storage_size_bytes": {"head_chunks_bytes", true},
		"prometheus_tsdb_storage_blocks_bytes":           {"local_blocks_bytes", true},
		"phonehome_storage_bucket_lag_seconds":           {"bucket_lag_seconds", false},
		"phonehome_storage_blocks_pending_upload":        {"blocks_pending_upload", false},
	}
	for _, mf := range mfs {
		w, ok := want[mf.GetName()]
		if !ok || w.key == "" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if w.perTenant && labelOf(m, "tenant") != tenant {
				continue
			}
			sel := mf.GetName()
			if w.perTenant {
				sel += `{tenant="` + tenant + `"}`
			}
			out[w.key] = figure{Value: finite(valueOf(m)), Source: source{Metric: sel}}
		}
	}
	return out
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func valueOf(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

func (s *Status) historyAPI(r *http.Request, tenant string) (any, error) {
	hours, err := intParam(r, "hours", 6, 1, 24)
	if err != nil {
		return nil, err
	}
	return s.historyOf(tenant, hours), nil
}

// clusterJSON is one row of the clusters table.
type clusterJSON struct {
	ID               string            `json:"id"`
	State            string            `json:"state"` // reporting, late, silent
	LastSeen         *time.Time        `json:"last_seen"`
	Series           int64             `json:"series"`
	SeriesLimit      int               `json:"series_limit"`
	SamplesPerSecond float64           `json:"samples_per_second"`
	RateWindow       float64           `json:"samples_per_second_window_seconds"` // what it is averaged over
	RatePartial      bool              `json:"samples_per_second_partial"`        // first window not complete (limits.Rate)
	Samples          uint64            `json:"samples"`
	RefusedTotal     uint64            `json:"refused_total"`
	Refused          map[string]uint64 `json:"refused"`
	Protocol         string            `json:"protocol"`
	Client           string            `json:"client"`
	ForwarderVersion string            `json:"forwarder_version"`
	Definition       string            `json:"definition_version"`
}

func (s *Status) row(c *limits.ClusterStatus, seriesLimit int, now time.Time) clusterJSON {
	proto, client, def := c.Client()
	row := clusterJSON{
		ID: c.ID, Series: c.Series, SeriesLimit: seriesLimit, SamplesPerSecond: finite(c.Rate.Value),
		RateWindow: c.Rate.Span.Seconds(), RatePartial: c.Rate.Partial,
		Samples: c.Samples, RefusedTotal: c.Refused, Refused: c.Refusals(),
		Protocol: protocolName(proto), Client: client, ForwarderVersion: forwarderVersion(client), Definition: def,
	}
	switch age := now.Sub(c.LastSeen); {
	case c.LastSeen.IsZero():
		row.State = "unknown"
	case age <= s.reportingWindow():
		row.State = "reporting"
	case age <= s.silentAfter():
		row.State = "late"
	default:
		row.State = "silent"
	}
	if !c.LastSeen.IsZero() {
		t := c.LastSeen.UTC()
		row.LastSeen = &t
	}
	return row
}

// protocolName names a remote-write protobuf message by its spec version.
func protocolName(proto string) string {
	switch proto {
	case "prometheus.WriteRequest":
		return "1.0"
	case "io.prometheus.write.v2.Request":
		return "2.0"
	case "io.prometheus.client.MetricFamily":
		return "telemeter"
	}
	return proto
}

// forwarderVersion is the version of a "phonehome-forwarder/<version>"
// User-Agent, or "" for another client. The forwarder sends no version
// series: its User-Agent is where the receiver learns it.
func forwarderVersion(ua string) string {
	v, ok := strings.CutPrefix(ua, "phonehome-forwarder/")
	if !ok {
		return ""
	}
	v, _, _ = strings.Cut(v, " ")
	return v
}

// sortKeys are the clusters table's sort orders.
var sortKeys = map[string]func(a, b *limits.ClusterStatus) int{
	"id":                 func(a, b *limits.ClusterStatus) int { return strings.Compare(a.ID, b.ID) },
	"last_seen":          func(a, b *limits.ClusterStatus) int { return a.LastSeen.Compare(b.LastSeen) },
	"series":             func(a, b *limits.ClusterStatus) int { return cmp.Compare(a.Series, b.Series) },
	"samples_per_second": func(a, b *limits.ClusterStatus) int { return cmp.Compare(a.Rate.Value, b.Rate.Value) },
	"refused":            func(a, b *limits.ClusterStatus) int { return cmp.Compare(a.Refused, b.Refused) },
}

const maxPageSize = 1000

func (s *Status) clusters(r *http.Request, tenant string) (any, error) {
	q := r.URL.Query()
	for k := range q {
		switch k {
		case "tenant", "q", "sort", "order", "offset", "limit", "state":
		default:
			return nil, fmt.Errorf("unknown parameter %q: %w", k, errBadRequest)
		}
	}
	sortBy := cmp.Or(q.Get("sort"), "id")
	less, ok := sortKeys[sortBy]
	if !ok {
		return nil, fmt.Errorf("sort %q: want id, last_seen, series, samples_per_second or refused: %w", sortBy, errBadRequest)
	}
	order := cmp.Or(q.Get("order"), "asc")
	if order != "asc" && order != "desc" {
		return nil, fmt.Errorf("order %q: want asc or desc: %w", order, errBadRequest)
	}
	offset, err := intParam(r, "offset", 0, 0, 1<<30)
	if err != nil {
		return nil, err
	}
	limit, err := intParam(r, "limit", 100, 1, maxPageSize)
	if err != nil {
		return nil, err
	}
	prefix := q.Get("q")
	if len(prefix) > 256 {
		return nil, fmt.Errorf("q: at most 256 bytes: %w", errBadRequest)
	}
	state := q.Get("state")
	if state != "" && state != "reporting" && state != "late" && state != "silent" {
		return nil, fmt.Errorf("state %q: want reporting, late or silent: %w", state, errBadRequest)
	}

	now := s.opts.Now()
	all := s.opts.Limiter.Clusters(tenant)
	total := len(all)
	lim := s.opts.Limiter.For(tenant)
	matched := make([]*limits.ClusterStatus, 0, len(all))
	for i := range all {
		c := &all[i]
		if !strings.HasPrefix(c.ID, prefix) {
			continue
		}
		if state != "" && s.row(c, 0, now).State != state {
			continue
		}
		matched = append(matched, c)
	}
	cmpf := func(a, b *limits.ClusterStatus) int {
		if c := less(a, b); c != 0 {
			if order == "desc" {
				return -c
			}
			return c
		}
		return strings.Compare(a.ID, b.ID) // ties in a stable order, so pages do not overlap
	}
	page := topK(matched, offset+limit, cmpf)
	rows := []clusterJSON{}
	for i := offset; i < len(page); i++ {
		rows = append(rows, s.row(page[i], lim.MaxSeriesPerCluster, now))
	}
	return map[string]any{
		"total": total, "matched": len(matched), "offset": offset, "limit": limit,
		"sort": sortBy, "order": order, "clusters": rows,
	}, nil
}

// topK returns the k smallest of xs by cmpf, sorted. It reorders xs. For a
// first page of a large table it costs a heap pass instead of a full sort.
func topK[T any](xs []T, k int, cmpf func(a, b T) int) []T {
	if k >= len(xs)/4 {
		slices.SortFunc(xs, cmpf)
		return xs[:min(k, len(xs))]
	}
	// A max-heap of the k smallest seen so far in xs[:k].
	h := xs[:k]
	down := func(i int) {
		for {
			l := 2*i + 1
			if l >= k {
				return
			}
			m := l
			if r := l + 1; r < k && cmpf(h[r], h[l]) > 0 {
				m = r
			}
			if cmpf(h[m], h[i]) <= 0 {
				return
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
	}
	for i := k/2 - 1; i >= 0; i-- {
		down(i)
	}
	for i := k; i < len(xs); i++ {
		if k > 0 && cmpf(xs[i], h[0]) < 0 {
			h[0], xs[i] = xs[i], h[0]
			down(0)
		}
	}
	slices.SortFunc(h, cmpf)
	return h
}

func intParam(r *http.Request, name string, def, lo, hi int) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s %q: want an integer from %d to %d: %w", name, v, lo, hi, errBadRequest)
	}
	return n, nil
}

// promDuration renders d as a PromQL duration.
func promDuration(d time.Duration) string {
	if d%time.Minute == 0 {
		return strconv.Itoa(int(d/time.Minute)) + "m"
	}
	return strconv.Itoa(int(d/time.Second)) + "s"
}

func (s *Status) cluster(r *http.Request, tenant string) (any, error) {
	id := r.PathValue("id")
	hours, err := intParam(r, "hours", 6, 1, 48)
	if err != nil {
		return nil, err
	}
	c, ok := s.opts.Limiter.Cluster(tenant, id)
	if !ok {
		return nil, fmt.Errorf("cluster %q: %w", id, errNotFound)
	}
	now := s.opts.Now()
	lim := s.opts.Limiter.For(tenant)
	sel := fmt.Sprintf(`{_id=%q}`, id)
	out := map[string]any{
		"cluster": s.row(&c, lim.MaxSeriesPerCluster, now),
		"sources": map[string]source{
			"series":             {PromQL: "count(" + sel + ")"},
			"samples_per_second": {PromQL: rateQuery(sel, c.Rate.Span)},
			"series_by_metric":   {PromQL: "count by (__name__) (" + sel + ")"},
			"definition_version": {PromQL: `phonehome_gathering_definition_info` + strings.TrimSuffix(sel, "}") + "}"},
		},
	}
	refusals := []map[string]any{}
	for _, rf := range s.opts.Limiter.RecentRefusals(tenant, id) {
		refusals = append(refusals, map[string]any{"time": rf.Time.UTC(), "reason": rf.Reason, "samples": rf.Count, "example": rf.Example})
	}
	out["recent_refusals"] = refusals

	ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
	defer cancel()
	ctx = auth.WithIdentity(ctx, auth.Identity{Tenant: tenant})
	byMetric, err := s.seriesByMetric(ctx, tenant, id, now)
	if err != nil {
		return nil, err
	}
	out["series_by_metric"] = byMetric
	chart, err := s.chart(ctx, tenant, sel, now, time.Duration(hours)*time.Hour)
	if err != nil {
		return nil, err
	}
	out["chart"] = chart
	return out, nil
}

type metricCount struct {
	Metric string `json:"metric"`
	Series int    `json:"series"`
}

// seriesByMetric counts the cluster's series with samples in the last
// RateWindow in the TSDB, per metric name, most first.
func (s *Status) seriesByMetric(ctx context.Context, tenant, id string, now time.Time) ([]metricCount, error) {
	out := []metricCount{}
	if s.opts.Reader == nil {
		return out, nil
	}
	mint := now.Add(-limits.RateWindow).UnixMilli()
	q, err := s.opts.Reader.Querier(tenant, mint, now.UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("open querier: %w", err)
	}
	defer q.Close()
	set := q.Select(ctx, false, &promstorage.SelectHints{Start: mint, End: now.UnixMilli(), Func: "series"},
		labels.MustNewMatcher(labels.MatchEqual, "_id", id))
	counts := map[string]int{}
	for set.Next() {
		counts[set.At().Labels().Get(model.MetricNameLabel)]++
	}
	if err := set.Err(); err != nil {
		return nil, fmt.Errorf("select series: %w", err)
	}
	for m, n := range counts {
		out = append(out, metricCount{m, n})
	}
	slices.SortFunc(out, func(a, b metricCount) int {
		return cmp.Or(cmp.Compare(b.Series, a.Series), strings.Compare(a.Metric, b.Metric))
	})
	return out, nil
}

type chartJSON struct {
	Step             int       `json:"step_seconds"`
	Time             []int64   `json:"t"`
	SamplesPerSecond []float64 `json:"samples_per_second"`
	Series           []float64 `json:"series"`
}

// chart is the cluster's samples/s and series over the last span, from
// the TSDB, in at most 120 steps.
func (s *Status) chart(ctx context.Context, tenant, sel string, now time.Time, span time.Duration) (chartJSON, error) {
	step := max(span/120, time.Minute).Truncate(time.Second)
	out := chartJSON{Step: int(step.Seconds()), Time: []int64{}, SamplesPerSecond: []float64{}, Series: []float64{}}
	if s.opts.Reader == nil || s.opts.Engine == nil {
		return out, nil
	}
	end := now // not truncated: the last point has the freshest data
	start := end.Add(-span)
	queryable := promstorage.QueryableFunc(func(mint, maxt int64) (promstorage.Querier, error) {
		return s.opts.Reader.Querier(tenant, mint, maxt)
	})
	run := func(expr string) (map[int64]float64, error) {
		qry, err := s.opts.Engine.NewRangeQuery(ctx, queryable, nil, expr, start, end, step)
		if err != nil {
			return nil, fmt.Errorf("query %s: %w", expr, err)
		}
		defer qry.Close()
		res := qry.Exec(ctx)
		if res.Err != nil {
			return nil, fmt.Errorf("query %s: %w", expr, res.Err)
		}
		vals := map[int64]float64{}
		if m, ok := res.Value.(promql.Matrix); ok {
			for _, series := range m {
				for _, p := range series.Floats {
					vals[p.T] = p.F
				}
			}
		}
		return vals, nil
	}
	rate, err := run(rateQuery(sel, limits.RateWindow))
	if err != nil {
		return out, err
	}
	series, err := run(fmt.Sprintf("count(last_over_time(%s[%s]))", sel, promDuration(limits.RateWindow)))
	if err != nil {
		return out, err
	}
	for t := start; !t.After(end); t = t.Add(step) {
		ms := t.UnixMilli()
		out.Time = append(out.Time, t.Unix())
		out.SamplesPerSecond = append(out.SamplesPerSecond, finite(rate[ms]))
		out.Series = append(out.Series, finite(series[ms]))
	}
	return out, nil
}
