package fleet

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// PrintSummary writes a human-readable summary of r.
func PrintSummary(w io.Writer, r *Result) {
	fmt.Fprintf(w, "target            %s\n", r.URL)
	fmt.Fprintf(w, "active series     %d (%d clusters × %d)\n", r.ActiveSeries, r.Clusters, r.SeriesPerClus)
	fmt.Fprintf(w, "rounds            %d of %d", r.RoundsDone, r.Rounds)
	if r.Aborted != "" {
		fmt.Fprintf(w, " (aborted: %s)", r.Aborted)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "requests          %d, codes %s\n", r.Requests, formatCodes(r.Codes))
	fmt.Fprintf(w, "samples           %d sent, %d accepted\n", r.Samples, r.Accepted)
	fmt.Fprintf(w, "bytes             %d sent (snappy), %.1f B/sample\n", r.BytesSent, float64(r.BytesSent)/max(float64(r.Samples), 1))
	fmt.Fprintf(w, "accepted/s        %.0f overall, %.0f series creation (round 0), %.0f steady (rounds 1+)\n",
		r.AcceptedPerSec, r.CreateAcceptedPerSec, r.SteadyAcceptedPerSec)
	fmt.Fprintf(w, "latency           p50 %s p99 %s max %s (all); steady p50 %s p99 %s\n",
		ms(r.Latency.P50), ms(r.Latency.P99), ms(r.Latency.Max), ms(r.SteadyLatency.P50), ms(r.SteadyLatency.P99))
	for code, msg := range r.ErrorExamples {
		fmt.Fprintf(w, "example %-9s %s\n", code, strings.TrimSpace(msg))
	}
}

func ms(s float64) string { return fmt.Sprintf("%.1fms", s*1000) }

func formatCodes(c map[string]int64) string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, c[k])
	}
	return strings.Join(parts, " ")
}
