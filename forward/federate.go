package forward

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/model/textparse"
)

// Sample is one parsed federated sample. Exactly one of H, FH is set for a
// native histogram; otherwise V holds the float value.
type Sample struct {
	Labels labels.Labels
	T      int64 // milliseconds; the original timestamp from /federate
	V      float64
	H      *histogram.Histogram
	FH     *histogram.FloatHistogram
	// Meta is the metadata of the sample's metric family from the exposition
	// (# TYPE, # HELP, # UNIT, or the protobuf MetricFamily); the zero value
	// if there was none. Type is model.MetricTypeUnknown for untyped.
	Meta metadata.Metadata

	// key, when set, identifies the series within the Federator's responses:
	// samples with equal keys have equal Labels. It is the parser's raw
	// series bytes (as Prometheus' scrape cache keys series), prefixed with
	// the format and the family's type, on which the text parser's label
	// values depend (le, quantile normalization).
	key []byte
	// lazy, when set, means Labels and Meta are not filled in yet: the
	// consumer calls loadLabels if it needs them (see lazySource).
	lazy *streamer
}

// loadLabels fills in Labels and Meta if the Source deferred them.
func (smp *Sample) loadLabels() {
	if smp.lazy == nil {
		return
	}
	smp.lazy.p.Labels(&smp.Labels)
	smp.Meta = smp.lazy.metaFor(smp.Labels.Get(model.MetricNameLabel))
	smp.lazy = nil
}

// metaFor returns Meta for a sample of the series named name, without
// loading deferred labels.
func (smp *Sample) metaFor(name string) metadata.Metadata {
	if smp.lazy == nil {
		return smp.Meta
	}
	return smp.lazy.metaFor(name)
}

// FetchStats describes one fetch.
type FetchStats struct {
	Bytes int64 // response body bytes read
	// OverBytes counts samples that arrived after MaxBytes and were not passed on.
	OverBytes int
}

// Source produces the samples of one collection cycle. Fetch calls fn for
// every sample, in order, from the calling goroutine; the Sample and its
// labels are only valid during the call. If fn returns an error Fetch stops
// and returns it.
type Source interface {
	Fetch(ctx context.Context, fn func(*Sample) error) (FetchStats, error)
}

// FederateOptions configures a Federator.
type FederateOptions struct {
	// Matches are sent as match[] parameters; at least one is required by Prometheus.
	Matches []string
	// TokenFile, if set, is read before every request and sent as a bearer token.
	TokenFile string
	// MaxBytes caps the response bytes that are kept (0: no cap). Complete
	// samples within the cap are kept; later ones are only counted
	// (FetchStats.OverBytes), so the cycle never fails because of the cap.
	MaxBytes int64
	// UserAgent is sent with every request.
	UserAgent string
}

// lazySource is a MatchingSource that can defer parsing the labels of a
// sample until the consumer asks (Sample.loadLabels), and identifies series
// by Sample.key. The Federator is one.
type lazySource interface {
	fetchLazy(ctx context.Context, matches []string, fn func(*Sample) error) (FetchStats, error)
}

// acceptHeader negotiates like Prometheus' scraper: delimited protobuf first,
// then the text format. (Prometheus' /federate serves only these two.)
const acceptHeader = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.1"

const (
	chunkBytes    = 256 << 10 // parse granularity
	maxEntryBytes = 16 << 20  // longest accepted text line / protobuf family
	// maxKeptChunk is the largest parse buffer kept for the next fetch: a
	// chunk grows beyond chunkBytes to hold a whole protobuf family.
	maxKeptChunk = 8 << 20
)

var errEntryTooLarge = errors.New("exposition entry too large")

// Federator fetches <base>/federate from a Prometheus. It streams the
// response: memory is bounded by the parse chunk size, not the response size.
// Safe for concurrent use.
type Federator struct {
	base   url.URL // <base>/federate without parameters
	url    string  // with FederateOptions.Matches
	client *http.Client
	opts   FederateOptions
	now    func() time.Time
	// spare holds the buffers of the last fetch for the next one (a
	// sync.Pool would lose them to the GC between cycles minutes apart).
	mu    sync.Mutex
	spare *streamBufs
}

// streamBufs are a streamer's buffers, reused across fetches.
type streamBufs struct {
	r          *bufio.Reader
	chunk, key []byte
}

// NewFederator returns a Federator for the Prometheus at base (e.g.
// https://prometheus-k8s.openshift-monitoring.svc:9091).
func NewFederator(base *url.URL, client *http.Client, opts FederateOptions) *Federator {
	u := *base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/federate"
	f := &Federator{base: u, client: client, opts: opts, now: time.Now}
	f.url = f.urlFor(opts.Matches)
	return f
}

func (f *Federator) urlFor(matches []string) string {
	if f.url != "" && slices.Equal(matches, f.opts.Matches) {
		return f.url
	}
	u := f.base
	q := u.Query()
	for _, m := range matches {
		q.Add("match[]", m)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// Fetch implements Source with FederateOptions.Matches.
func (f *Federator) Fetch(ctx context.Context, fn func(*Sample) error) (FetchStats, error) {
	return f.fetch(ctx, f.url, fn, false)
}

// FetchMatching implements MatchingSource: Fetch with other match[] selectors.
func (f *Federator) FetchMatching(ctx context.Context, matches []string, fn func(*Sample) error) (FetchStats, error) {
	return f.fetch(ctx, f.urlFor(matches), fn, false)
}

// fetchLazy implements lazySource.
func (f *Federator) fetchLazy(ctx context.Context, matches []string, fn func(*Sample) error) (FetchStats, error) {
	return f.fetch(ctx, f.urlFor(matches), fn, true)
}

// withoutSelectors shortens the URL in a failed request's error to its
// endpoint and the number of selectors: the federate URL carries every one
// (OpenShift's allowlist makes it ~20 KB), which would bury the reason in
// the log line.
func withoutSelectors(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	if u, perr := url.Parse(ue.URL); perr == nil && u.RawQuery != "" {
		n := len(u.Query()["match[]"])
		u.RawQuery = ""
		ue.URL = fmt.Sprintf("%s (%d match[])", u, n)
	}
	return err
}

func (f *Federator) fetch(ctx context.Context, target string, fn func(*Sample) error, lazy bool) (FetchStats, error) {
	var st FetchStats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return st, fmt.Errorf("build federate request: %w", err)
	}
	req.Header.Set("Accept", acceptHeader)
	if f.opts.UserAgent != "" {
		req.Header.Set("User-Agent", f.opts.UserAgent)
	}
	if err := setBearer(req, f.opts.TokenFile); err != nil {
		return st, err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return st, fmt.Errorf("federate: %w", withoutSelectors(err))
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return st, fmt.Errorf("federate: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	f.mu.Lock()
	bufs := f.spare
	f.spare = nil
	f.mu.Unlock()
	if bufs == nil {
		bufs = &streamBufs{r: bufio.NewReaderSize(nil, 64<<10)}
	}
	bufs.r.Reset(resp.Body)
	s := &streamer{
		proto:    mt == "application/vnd.google.protobuf",
		lazy:     lazy,
		maxBytes: f.opts.MaxBytes,
		fn:       fn,
		st:       labels.NewSymbolTable(),
		defTS:    f.now().UnixMilli(),
		chunk:    bufs.chunk[:0],
		key:      bufs.key[:0],
	}
	err = s.run(bufs.r)
	st.Bytes, st.OverBytes = s.read, s.over
	bufs.r.Reset(nil)
	if cap(s.chunk) <= maxKeptChunk { // not one huge family's
		bufs.chunk, bufs.key = s.chunk[:0], s.key[:0]
		f.mu.Lock()
		f.spare = bufs
		f.mu.Unlock()
	}
	return st, err
}

func setBearer(req *http.Request, tokenFile string) error {
	if tokenFile == "" {
		return nil
	}
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		return fmt.Errorf("read token file: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(b)))
	return nil
}

// streamer cuts the body into chunks at entry boundaries (lines, or
// length-delimited protobuf families) and parses each with Prometheus'
// textparse parsers.
type streamer struct {
	proto    bool
	lazy     bool // defer the labels of samples (Sample.lazy)
	maxBytes int64
	fn       func(*Sample) error
	st       *labels.SymbolTable
	defTS    int64

	read  int64 // bytes consumed from the body
	kept  int64 // bytes of entries passed to the kept region
	over  int   // samples beyond maxBytes
	chunk []byte
	key   []byte // the current sample's key
	p     textparse.Parser
	// overflow is set once an entry does not fit maxBytes; from then on
	// samples are counted, not passed on.
	overflow bool
	sample   Sample
	// family is the metric family whose metadata entries were seen last.
	family string
	meta   metadata.Metadata
}

// familySuffixes are the series name suffixes that belong to a family.
var familySuffixes = []string{"_bucket", "_sum", "_count", "_total", "_created", "_info", "_gsum", "_gcount"}

// setFamily starts a new family's metadata when name changes.
func (s *streamer) setFamily(name []byte) {
	if string(name) != s.family {
		s.family = string(name)
		s.meta = metadata.Metadata{Type: model.MetricTypeUnknown}
	}
}

// metaFor returns the metadata of the current family if the series name belongs to it.
func (s *streamer) metaFor(name string) metadata.Metadata {
	if s.family == "" {
		return metadata.Metadata{}
	}
	if name == s.family {
		return s.meta
	}
	if rest, ok := strings.CutPrefix(name, s.family); ok && slices.Contains(familySuffixes, rest) {
		return s.meta
	}
	return metadata.Metadata{}
}

func (s *streamer) run(r *bufio.Reader) error {
	for {
		start := len(s.chunk)
		n, err := s.next(r)
		if n > 0 {
			if !s.overflow && s.maxBytes > 0 && s.kept+int64(n) > s.maxBytes {
				if err := s.flush(start); err != nil { // what fits
					return err
				}
				s.overflow = true
			}
			if !s.overflow {
				s.kept += int64(n)
			}
			if len(s.chunk) >= chunkBytes {
				if err := s.flush(len(s.chunk)); err != nil {
					return err
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return s.flush(len(s.chunk))
		}
		if err != nil {
			_ = s.flush(len(s.chunk))
			return err
		}
	}
}

// next appends the next complete entry to s.chunk and returns its length.
// On an error other than io.EOF nothing is appended.
func (s *streamer) next(r *bufio.Reader) (int, error) {
	start := len(s.chunk)
	if s.proto {
		n, err := binary.ReadUvarint(r)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return 0, io.EOF
			}
			return 0, fmt.Errorf("read protobuf length: %w", err)
		}
		if n > maxEntryBytes {
			return 0, fmt.Errorf("metric family of %d bytes: %w", n, errEntryTooLarge)
		}
		s.chunk = binary.AppendUvarint(s.chunk, n)
		hdr := len(s.chunk)
		s.chunk = slices.Grow(s.chunk, int(n))[:hdr+int(n)]
		if _, err := io.ReadFull(r, s.chunk[hdr:]); err != nil {
			s.chunk = s.chunk[:start]
			return 0, fmt.Errorf("read protobuf family: %w", err)
		}
		s.read += int64(len(s.chunk) - start)
		return len(s.chunk) - start, nil
	}
	line, err := r.ReadSlice('\n')
	s.chunk = append(s.chunk, line...)
	for errors.Is(err, bufio.ErrBufferFull) {
		if len(s.chunk)-start > maxEntryBytes {
			s.chunk = s.chunk[:start]
			return 0, fmt.Errorf("line longer than %d bytes: %w", maxEntryBytes, errEntryTooLarge)
		}
		line, err = r.ReadSlice('\n')
		s.chunk = append(s.chunk, line...)
	}
	n := len(s.chunk) - start
	s.read += int64(n)
	if err != nil && !errors.Is(err, io.EOF) {
		s.chunk = s.chunk[:start]
		return 0, fmt.Errorf("read federate body: %w", err)
	}
	if errors.Is(err, io.EOF) && n > 0 && s.chunk[len(s.chunk)-1] != '\n' {
		s.chunk = append(s.chunk, '\n') // last line without newline
		n++
	}
	return n, err
}

// flush parses s.chunk[:end] and keeps the rest at the front of s.chunk.
func (s *streamer) flush(end int) error {
	if end == 0 {
		return nil
	}
	defer func() { s.chunk = s.chunk[:copy(s.chunk, s.chunk[end:])] }()
	var (
		p   textparse.Parser
		tag byte // in keys: which parser's raw series bytes follow
	)
	if s.proto {
		p, tag = textparse.NewProtobufParser(s.chunk[:end], false, false, false, false, s.st), 'p'
	} else {
		p, tag = textparse.NewPromParser(s.chunk[:end], s.st, false), 't'
	}
	s.p = p
	// mtype mirrors the text parser's notion of the current type (the last
	// # TYPE of this parser, which its Labels use); it goes into keys.
	var mtype model.MetricType
	for {
		e, err := p.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("parse federate response: %w", err)
		}
		var (
			ts     *int64
			series []byte
		)
		smp := &s.sample
		*smp = Sample{Labels: smp.Labels}
		switch e {
		case textparse.EntryType:
			name, t := p.Type()
			mtype = t
			s.setFamily(name)
			if t == "untyped" {
				t = model.MetricTypeUnknown
			}
			s.meta.Type = t
			continue
		case textparse.EntryHelp:
			name, help := p.Help()
			s.setFamily(name)
			s.meta.Help = string(help)
			continue
		case textparse.EntryUnit:
			name, unit := p.Unit()
			s.setFamily(name)
			s.meta.Unit = string(unit)
			continue
		case textparse.EntrySeries:
			series, ts, smp.V = p.Series()
		case textparse.EntryHistogram:
			series, ts, smp.H, smp.FH = p.Histogram()
		default:
			continue
		}
		if s.overflow {
			s.over++
			continue
		}
		smp.T = s.defTS
		if ts != nil {
			smp.T = *ts
		}
		if s.lazy {
			s.key = append(append(append(s.key[:0], tag, byte(len(mtype))), mtype...), series...)
			smp.Labels, smp.key, smp.lazy = labels.EmptyLabels(), s.key, s
		} else {
			p.Labels(&smp.Labels)
			smp.Meta = s.metaFor(smp.Labels.Get(model.MetricNameLabel))
		}
		if err := s.fn(smp); err != nil {
			return err
		}
	}
}
