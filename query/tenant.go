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
// known from the context of Select and the label calls.
type tenantQuerier struct {
	r          Reader
	mint, maxt int64

	mu     sync.Mutex
	opened map[string]promstorage.Querier
}

func (q *tenantQuerier) querier(ctx context.Context) (promstorage.Querier, error) {
	id, ok := auth.FromContext(ctx)
	if !ok || id.Tenant == "" {
		return nil, errNoTenant
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if inner, ok := q.opened[id.Tenant]; ok {
		return inner, nil
	}
	inner, err := q.r.Querier(id.Tenant, q.mint, q.maxt)
	if err != nil {
		return nil, err
	}
	if q.opened == nil {
		q.opened = map[string]promstorage.Querier{}
	}
	q.opened[id.Tenant] = inner
	return inner, nil
}

func (q *tenantQuerier) Select(ctx context.Context, sortSeries bool, hints *promstorage.SelectHints, ms ...*labels.Matcher) promstorage.SeriesSet {
	inner, err := q.querier(ctx)
	if err != nil {
		return promstorage.ErrSeriesSet(err)
	}
	return inner.Select(ctx, sortSeries, hints, ms...)
}

func (q *tenantQuerier) LabelValues(ctx context.Context, name string, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	inner, err := q.querier(ctx)
	if err != nil {
		return nil, nil, err
	}
	return inner.LabelValues(ctx, name, hints, ms...)
}

func (q *tenantQuerier) LabelNames(ctx context.Context, hints *promstorage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	inner, err := q.querier(ctx)
	if err != nil {
		return nil, nil, err
	}
	return inner.LabelNames(ctx, hints, ms...)
}

func (q *tenantQuerier) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	var errs []error
	for _, inner := range q.opened {
		errs = append(errs, inner.Close())
	}
	q.opened = nil
	return errors.Join(errs...)
}
