package labelhash

import (
	"hash/maphash"
	"testing"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

func TestSumSeparatesOrderAndBoundaries(t *testing.T) {
	seed := maphash.MakeSeed()
	sum := func(kv ...string) uint64 {
		var ls []prompb.Label
		for i := 0; i < len(kv); i += 2 {
			ls = append(ls, prompb.Label{Name: kv[i], Value: kv[i+1]})
		}
		return Seeded(seed, ls)
	}
	base := sum("a", "b", "c", "d")
	require.Equal(t, base, sum("a", "b", "c", "d"), "deterministic for one seed")
	for _, other := range []uint64{
		sum("a", "bc", "", "d"), // boundary moved
		sum("ab", "", "c", "d"),
		sum("c", "d", "a", "b"), // order
		sum("a", "b"),           // fewer labels
		sum("a", "b", "c", "d", "", ""),
		sum(),
	} {
		require.NotEqual(t, base, other)
	}
	ab := []prompb.Label{{Name: "a", Value: "b"}, {Name: "c", Value: "d"}}
	require.NotEqual(t, base, Seeded(maphash.MakeSeed(), ab), "seeded")
	require.NotEqual(t, Unseeded(ab), Unseeded([]prompb.Label{{Name: "a", Value: "bc"}, {Name: "", Value: "d"}}))
	require.NotEqual(t, Unseeded(ab), Unseeded([]prompb.Label{{Name: "c", Value: "d"}, {Name: "a", Value: "b"}}))
}

func BenchmarkHash(b *testing.B) {
	seed := maphash.MakeSeed()
	ls := []prompb.Label{
		{Name: "__name__", Value: "cluster_operator_conditions"}, {Name: "_id", Value: "3c6b1b8e-8d9f-4f7a-9e0b-1a2b3c4d5e6f"},
		{Name: "condition", Value: "Available"}, {Name: "endpoint", Value: "metrics"}, {Name: "instance", Value: "10.0.0.1:9099"},
		{Name: "job", Value: "cluster-version-operator"}, {Name: "name", Value: "authentication"},
		{Name: "namespace", Value: "openshift-cluster-version"}, {Name: "pod", Value: "cluster-version-operator-5d4f6b7c8-abcde"},
		{Name: "reason", Value: "AsExpected"}, {Name: "service", Value: "cluster-version-operator"},
	}
	b.Run("seeded", func(b *testing.B) {
		for b.Loop() {
			_ = Seeded(seed, ls)
		}
	})
	b.Run("unseeded", func(b *testing.B) {
		for b.Loop() {
			_ = Unseeded(ls)
		}
	})
}
