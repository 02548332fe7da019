package storage

import (
	"testing"

	"github.com/prometheus/prometheus/prompb"
)

func BenchmarkSeriesKey(b *testing.B) {
	r := newSeriesRefs()
	ls := []prompb.Label{{Name: "__name__", Value: "cluster_operator_conditions"}, {Name: "_id", Value: "3c6b1b8e-8d9f-4f7a-9e0b-1a2b3c4d5e6f"}, {Name: "condition", Value: "Available"}, {Name: "endpoint", Value: "metrics"}, {Name: "instance", Value: "10.0.0.1:9099"}, {Name: "job", Value: "cluster-version-operator"}, {Name: "name", Value: "authentication"}, {Name: "namespace", Value: "openshift-cluster-version"}, {Name: "pod", Value: "cluster-version-operator-5d4f6b7c8-abcde"}, {Name: "reason", Value: "AsExpected"}, {Name: "service", Value: "cluster-version-operator"}}
	for b.Loop() {
		_ = r.key(ls)
	}
}
