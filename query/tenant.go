package query

import (
	"context"
	"errors"
	"sync"

	"github.com/prometheus/prometheus/model/labels"
	promstorage "github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/phonehome/phonehome/auth"
)

// Reader opens queriers over one tenant's data. Implementations return an
// empty querier for a tenant they do not know.
type Reader interface {
	Querier(tenant string, mint, maxt int64) (promstorage.Querier, error)
}

// errNoTenant means a query reached storage without an authenticated tenant;
// it is a wiring bug, never the caller's fault.
var errNoTenant = errors.New("query has no authenticated tenant")

// tenantQueryable scopes every query to the tenant in its context, so the
// engine and the HTTP API can stay tenant-unaware.
type tenantQueryable struct{ r Reader }

// NewQueryable returns r as a storage.Queryable that reads the tenant of
// each call's context.
func NewQueryable(r Reader) promstorage.Queryable { return tenantQueryable{r} }

func (q tenantQueryable) Querier(mint, maxt int64) (promstorage.Querier, error) {
	return &tenantQuerier{r: q.r, mint: mint, maxt: maxt}, nil
}

// tenantQuerier opens the tenant's querier on first use: the tenant is only
// known from the context of Select and the label calls. A label call
// whose context has several match[] sets (withMatchSets) asks for them
// all at the first (labelBatch).
type tenantQuerier struct {
	r          Reader
	mint, maxt int64

	mu     sync.Mutex
	opened map[string]promstorage.Querier
	batch  *labelBatch
}

func (q *tenantQuerier) querier(ctx context.Context) (tenant string, inner promstorage.Querier, err error) {
	id, ok := auth.FromContext(ctx)
	if !ok || id.Tenant == "" {
		return "", nil, errNoTenant
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if inner, ok := q.opened[id.Tenant]; ok {
		return id.Tenant, inner, nil
	}
	inner, err = q.r.Querier(id.Tenant, q.mint, q.maxt)
	if err != nil {
		return "", nil, err
	}
	if q.opened == nil {
		q.opened = map[string]promstorage.Querier{}
	}
	q.opened[id.Tenant] = inner
	return id.Tenant, inner, nil
}

func (q *tenantQuerier) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.SeriesSet {
	_, inner, err := q.querier(ctx)
	if err != nil {
		return promstorage.ErrSeriesSet(err)
	}
	return inner.Select(ctx, sortSeries, hints, ms...)
}

func (q *tenantQuerier) LabelValues(ctx context.Context, name string, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	tenant, inner, err := q.querier(ctx)
	if err != nil {
		return nil, nil, err
	}
	return q.batched(ctx, newLabelCall(tenant, true, name, hints), ms, func(ctx context.Context, ms []*labels.Matcher) ([]string, annotations.Annotations, error) {
		return inner.LabelValues(ctx, name, hints, ms...)
	})
}

func (q *tenantQuerier) LabelNames(ctx context.Context, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	tenant, inner, err := q.querier(ctx)
	if err != nil {
		return nil, nil, err
	}
	return q.batched(ctx, newLabelCall(tenant, false, "", hints), ms, func(ctx context.Context, ms []*labels.Matcher) ([]string, annotations.Annotations, error) {
		return inner.LabelNames(ctx, hints, ms...)
	})
}

// batched answers call for ms with ask, from the request's batch when its
// context has several match[] sets: the first call starts it.
func (q *tenantQuerier) batched(ctx context.Context, call labelCall, ms []*labels.Matcher, ask labelAsk) ([]string, annotations.Annotations, error) {
	if sets := matchSets(ctx); len(sets) > 1 {
		q.mu.Lock()
		if q.batch == nil {
			q.batch = startLabelBatch(ctx, call, sets, ask)
		}
		b := q.batch
		q.mu.Unlock()
		if r, ok := b.answer(call, ms); ok {
			return r.vals, r.ws, r.err
		}
	}
	return ask(ctx, ms)
}

func (q *tenantQuerier) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.batch != nil { // its calls use the queriers closed below
		q.batch.stop()
		q.batch = nil
	}
	var errs []error
	for _, inner := range q.opened {
		errs = append(errs, inner.Close())
	}
	q.opened = nil
	return errors.Join(errs...)
}
