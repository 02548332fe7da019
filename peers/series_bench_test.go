package peers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
)

// BenchmarkDecodeSeries decodes a peer's /series answer of 10k series.
func BenchmarkDecodeSeries(b *testing.B) {
	data := make([]map[string]string, 10_000)
	for i := range data {
		data[i] = map[string]string{"__name__": "csv_succeeded", "_id": fmt.Sprintf("cluster-%05d", i/10), "name": fmt.Sprintf("op-%d", i%10), "namespace": "openshift-operators"}
	}
	answer, err := json.Marshal(map[string]any{"status": "success", "data": data})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(answer)))
	for b.Loop() {
		if _, err := decodeEnvelope(json.NewDecoder(bytes.NewReader(answer)), func(d *json.Decoder) error {
			_, err := decodeSeries(d)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
}
