package forward

import (
	"testing"
	"time"

	"github.com/alecthomas/units"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

func TestParseFileConfig(t *testing.T) {
	c, err := ParseFileConfig([]byte(`
matches: ['up']
anonymize_labels: [namespace]
relabel_configs:
  - action: labeldrop
    regex: prometheus_replica
federate:
  max_series: 10
  max_bytes: 1MiB
send:
  max_backoff: 2m
queue:
  max_bytes: 1GiB
`))
	require.NoError(t, err)
	require.Equal(t, []string{"up"}, c.Matches)
	require.Len(t, c.RelabelConfigs, 1)
	require.Equal(t, "labeldrop", string(c.RelabelConfigs[0].Action))
	require.Equal(t, units.MiB, c.Federate.MaxBytes)
	require.Equal(t, model.Duration(2*time.Minute), c.Send.MaxBackoff)
	require.Equal(t, model.Duration(time.Second), c.Send.MinBackoff, "defaults kept")
	require.Equal(t, units.GiB, c.Queue.MaxBytes)
	require.Equal(t, defaultSeriesCacheSize, c.Federate.SeriesCacheSize(), "cache on by default")

	off, err := ParseFileConfig([]byte("federate: {cache_series: 0}\n"))
	require.NoError(t, err)
	require.Negative(t, off.Federate.SeriesCacheSize(), "0 turns the cache off")

	empty, err := ParseFileConfig(nil)
	require.NoError(t, err)
	require.Equal(t, DefaultFileConfig(), empty)
}

func TestParseFileConfigErrors(t *testing.T) {
	_, err := ParseFileConfig([]byte("queue:\n  max_byte: 1\n"))
	require.ErrorContains(t, err, "queue.max_byte: line 2: unknown key")

	// Every decoding problem, by YAML path and line, not only the first.
	_, err = ParseFileConfig([]byte("send:\n  timeout: 30seconds\n  timout: 1s\nqueue:\n  max_bytes: 8Mb\n"))
	require.EqualError(t, err, "decode config: "+
		"send.timeout: line 2: want a duration such as 30s, 5m or 1h30m, found a string\n"+
		"send.timout: line 3: unknown key\n"+
		"queue.max_bytes: line 5: want a byte size such as 512KiB or 8MiB, found a string")

	_, err = ParseFileConfig([]byte("send: {}\n---\nsend: {timout: 1s}\n"))
	require.ErrorContains(t, err, "line 2: a second YAML document")

	_, err = ParseFileConfig([]byte("relabel_configs:\n  - action: labeldrop\n    regexp: x\n"))
	require.ErrorContains(t, err, "regexp", "strictness reaches into relabel configs")

	_, err = ParseFileConfig([]byte(`
federate: {max_series: -1, timeout: 0s, cache_series: -1}
send: {max_samples_per_request: 0, min_backoff: 2m, max_backoff: 1m}
queue: {max_bytes: 1KiB}
`))
	require.Error(t, err)
	for _, want := range []string{"federate.max_series", "federate.timeout", "federate.cache_series", "send.max_samples_per_request", "send.max_backoff", "queue.max_bytes"} {
		require.ErrorContains(t, err, want)
	}
}

// TestSegmentBytesAtMostAQuarter: space is freed a whole segment at a time,
// so a segment as big as the queue would drop the whole backlog to append
// one record; configured and automatic sizes stay at a quarter at most.
func TestSegmentBytesAtMostAQuarter(t *testing.T) {
	_, err := ParseFileConfig([]byte("queue: {max_bytes: 1MiB, segment_bytes: 2MiB}\n"))
	require.ErrorContains(t, err, "queue.segment_bytes")
	_, err = ParseFileConfig([]byte("queue: {max_bytes: 1MiB, segment_bytes: 1MiB}\n"))
	require.NoError(t, err, "valid before: an upgrade must not stop a forwarder from starting")

	for _, o := range []QueueOptions{{MaxBytes: 64 << 10}, {MaxBytes: 64 << 10, SegmentBytes: 64 << 10}} {
		q, err := OpenQueue(t.TempDir(), discardLogger(), nil, o)
		require.NoError(t, err)
		require.Equal(t, int64(16<<10), q.opts.SegmentBytes, "%+v", o)
		require.NoError(t, q.Close())
	}
}
