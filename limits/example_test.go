package limits_test

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"go.yaml.in/yaml/v3"

	"github.com/phonehome/phonehome/limits"
)

// The receiver's use of a Limiter for one remote-write request.
func Example() {
	var cfg limits.Config
	dec := yaml.NewDecoder(strings.NewReader(`
defaults:
  max_series_per_cluster: 2
tenants:
  acme:
    samples_per_second_per_cluster: 10
    burst_per_cluster: 100
`))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		panic(err)
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := limits.New(nil, cfg, func() time.Time { return now })

	// After decoding: one rate check per request (429 + Retry-After).
	for _, n := range []int{80, 70} {
		retry, err := l.AllowSamples("acme", "cluster-a", n)
		fmt.Println(retry, err, errors.Is(err, limits.ErrRateLimited))
	}

	// Per series (its labels checked by the receiver as it decodes): the
	// series limits drop the series and keep the rest.
	s := l.Session("acme", "cluster-a")
	for _, ls := range []labels.Labels{
		labels.FromStrings("__name__", "up", "_id", "cluster-a", "job", "a"),
		labels.FromStrings("__name__", "up", "_id", "cluster-a", "job", "b"),
		labels.FromStrings("__name__", "up", "_id", "cluster-a", "job", "c"),
		labels.FromStrings("__name__", "up", "_id", "cluster-a", "job", "a"),
	} {
		fmt.Println(ls.Get("job"), s.Admit(ls.Get("__name__"), ls.Hash()))
	}
	// Output:
	// 0s <nil> false
	// 5s samples_per_second_per_cluster limit of 10 reached true
	// a <nil>
	// b <nil>
	// c max_series_per_cluster limit of 2 reached
	// a <nil>
}
