package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// heapGroup is a part of the receiver's live heap, by allocating function
// (pprof's flat in-use bytes after a forced GC).
type heapGroup struct {
	name string
	re   *regexp.Regexp // matched against the function name
}

// heapGroups is how issue 19 asks the bytes per series to be split; the
// first match wins, and what matches nothing is "everything else".
var heapGroups = []heapGroup{
	{"head memSeries (`tsdb.newMemSeries`)", regexp.MustCompile(`tsdb\.newMemSeries$`)},
	{"open head chunk (`chunkenc`, `memSeries.cutNewHeadChunk`)", regexp.MustCompile(`tsdb/chunkenc\.|tsdb\.\(\*memSeries\)\.cutNewHeadChunk`)},
	{"isolation ring (`tsdb.txRing`)", regexp.MustCompile(`tsdb\.(newTxRing|\(\*txRing\))`)},
	{"postings (`tsdb/index.MemPostings`)", regexp.MustCompile(`tsdb/index\.`)},
	{"stripe map (`tsdb.stripeSeries`, `seriesHashmap`)", regexp.MustCompile(`tsdb\.(\(\*stripeSeries\)|newStripeSeries|\(\*seriesHashmap\))`)},
	{"series labels (`model/labels`)", regexp.MustCompile(`model/labels\.`)},
	{"limiter (`limits`)", regexp.MustCompile(`phonehome/limits\.`)},
	{"head-ref cache (`storage.seriesRefs`)", regexp.MustCompile(`phonehome/storage\.\(\*seriesRefs\)`)},
}

var pprofLine = regexp.MustCompile(`^\s*([0-9.]+)([kMGT]?B)\s+[0-9.]+%\s+[0-9.]+%\s+[0-9.]+[kMGT]?B\s+[0-9.]+%\s+(.+)$`)

func parseBytes(num, unit string) float64 {
	v, _ := strconv.ParseFloat(num, 64)
	switch unit {
	case "kB":
		v *= 1 << 10
	case "MB":
		v *= 1 << 20
	case "GB":
		v *= 1 << 30
	case "TB":
		v *= 1 << 40
	}
	return v
}

// memStat reads "# Name = value" from a saved MemStats section.
func memStat(ms []byte, name string) float64 {
	sc := bufio.NewScanner(bytes.NewReader(ms))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# "+name+" = "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}

// writeHeapBreakdown splits the in-use heap of heapProfile into
// heapGroups, per active series, and, from the MemStats next to it, the
// rest of the process's memory, and writes the table to out.
func writeHeapBreakdown(bin, heapProfile, memstats string, series int, rss int64, out io.Writer) error {
	raw, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=100000", "-nodefraction=0", "-edgefraction=0", "-sample_index=inuse_space", bin, heapProfile).Output()
	if err != nil {
		return fmt.Errorf("pprof %s: %w", heapProfile, err)
	}
	sums := make([]float64, len(heapGroups)+1)
	var total float64
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		m := pprofLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		fn := strings.TrimSuffix(m[3], " (inline)")
		b := parseBytes(m[1], m[2])
		total += b
		k := len(heapGroups)
		for i, g := range heapGroups {
			if g.re.MatchString(fn) {
				k = i
				break
			}
		}
		sums[k] += b
	}
	n := float64(max(series, 1))
	fmt.Fprintf(out, "| part (after a forced GC) | MiB | bytes per active series (%d) |\n| --- | ---: | ---: |\n", series)
	for i, g := range heapGroups {
		fmt.Fprintf(out, "| %s | %.1f | %.0f |\n", g.name, sums[i]/(1<<20), sums[i]/n)
	}
	fmt.Fprintf(out, "| everything else in the heap profile | %.1f | %.0f |\n", sums[len(heapGroups)]/(1<<20), sums[len(heapGroups)]/n)
	fmt.Fprintf(out, "| **live heap (profile total)** | **%.1f** | **%.0f** |\n", total/(1<<20), total/n)
	if ms, err := os.ReadFile(memstats); err == nil {
		inuse, idle, released := memStat(ms, "HeapInuse"), memStat(ms, "HeapIdle"), memStat(ms, "HeapReleased")
		sys, heapSys := memStat(ms, "Sys"), memStat(ms, "HeapSys")
		// The profile samples one allocation per 512 KiB on average: its
		// parts are estimates (about ±6 % for 100 MiB), HeapInuse is exact.
		fmt.Fprintf(out, "| **heap in use (MemStats HeapInuse, exact; the profile's parts are sampled estimates)** | **%.1f** | **%.0f** |\n", inuse/(1<<20), inuse/n)
		fmt.Fprintf(out, "| heap spans in use beyond live objects (HeapInuse − profile) | %.1f | %.0f |\n", (inuse-total)/(1<<20), (inuse-total)/n)
		fmt.Fprintf(out, "| free heap not returned to the OS (HeapIdle − HeapReleased) | %.1f | %.0f |\n", (idle-released)/(1<<20), (idle-released)/n)
		fmt.Fprintf(out, "| runtime outside the heap (Sys − HeapSys: stacks, GC metadata, …) | %.1f | %.0f |\n", (sys-heapSys)/(1<<20), (sys-heapSys)/n)
	}
	if rss > 0 {
		fmt.Fprintf(out, "| **RSS after load** (before the forced GC) | **%.1f** | **%.0f** |\n", float64(rss)/(1<<20), float64(rss)/n)
	}
	return nil
}
