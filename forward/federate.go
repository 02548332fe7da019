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

// acceptHeader negotiates like Prometheus' scraper: delimited protobuf first,
// then the text format. (Prometheus' /federate serves only these two.)
const acceptHeader = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.1"

const (
	chunkBytes    = 256 << 10 // parse granularity
	maxEntryBytes = 16 << 20  // longest accepted text line / protobuf family
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
	return f.fetch(ctx, f.url, fn)
}

// FetchMatching implements MatchingSource: Fetch with other match[] selectors.
func (f *Federator) FetchMatching(ctx context.Context, matches []string, fn func(*Sample) error) (FetchStats, error) {
	return f.fetch(ctx, f.urlFor(matches), fn)
}

func (f *Federator) fetch(ctx context.Context, target string, fn func(*Sample) error) (FetchStats, error) {
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
		return st, fmt.Errorf("federate: %w", err)
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
	s := &streamer{
		proto:    mt == "application/vnd.google.protobuf",
		maxBytes: f.opts.MaxBytes,
		fn:       fn,
		st:       labels.NewSymbolTable(),
		defTS:    f.now().UnixMilli(),
	}
	err = s.run(bufio.NewReaderSize(resp.Body, 64<<10))
	st.Bytes, st.OverBytes = s.read, s.over
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
	maxBytes int64
	fn       func(*Sample) error
	st       *labels.SymbolTable
	defTS    int64

	read  int64 // bytes consumed from the body
	kept  int64 // bytes of entries passed to the kept region
	over  int   // samples beyond maxBytes
	chunk []byte
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
		entry, err := s.next(r)
		if len(entry) > 0 {
			if !s.overflow && s.maxBytes > 0 && s.kept+int64(len(entry)) > s.maxBytes {
				if err := s.flush(); err != nil {
					return err
				}
				s.overflow = true
			}
			if !s.overflow {
				s.kept += int64(len(entry))
			}
			s.chunk = append(s.chunk, entry...)
			if len(s.chunk) >= chunkBytes {
				if err := s.flush(); err != nil {
					return err
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return s.flush()
		}
		if err != nil {
			_ = s.flush()
			return err
		}
	}
}

// next returns the next complete entry. It may alias r's buffer until the
// next call.
func (s *streamer) next(r *bufio.Reader) ([]byte, error) {
	if s.proto {
		n, err := binary.ReadUvarint(r)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, io.EOF
			}
			return nil, fmt.Errorf("read protobuf length: %w", err)
		}
		if n > maxEntryBytes {
			return nil, fmt.Errorf("metric family of %d bytes: %w", n, errEntryTooLarge)
		}
		buf := binary.AppendUvarint(make([]byte, 0, int(n)+binary.MaxVarintLen64), n)
		hdr := len(buf)
		buf = buf[:hdr+int(n)]
		if _, err := io.ReadFull(r, buf[hdr:]); err != nil {
			return nil, fmt.Errorf("read protobuf family: %w", err)
		}
		s.read += int64(len(buf))
		return buf, nil
	}
	line, err := r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		long := append([]byte(nil), line...)
		for errors.Is(err, bufio.ErrBufferFull) {
			if len(long) > maxEntryBytes {
				return nil, fmt.Errorf("line longer than %d bytes: %w", maxEntryBytes, errEntryTooLarge)
			}
			line, err = r.ReadSlice('\n')
			long = append(long, line...)
		}
		line = long
	}
	s.read += int64(len(line))
	if errors.Is(err, io.EOF) && len(line) > 0 && line[len(line)-1] != '\n' {
		line = append(line, '\n') // last line without newline
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read federate body: %w", err)
	}
	return line, err
}

// flush parses the buffered chunk.
func (s *streamer) flush() error {
	if len(s.chunk) == 0 {
		return nil
	}
	defer func() { s.chunk = s.chunk[:0] }()
	var p textparse.Parser
	if s.proto {
		p = textparse.NewProtobufParser(s.chunk, false, false, false, false, s.st)
	} else {
		p = textparse.NewPromParser(s.chunk, s.st, false)
	}
	for {
		e, err := p.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("parse federate response: %w", err)
		}
		var ts *int64
		smp := &s.sample
		*smp = Sample{Labels: smp.Labels}
		switch e {
		case textparse.EntryType:
			name, t := p.Type()
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
			_, ts, smp.V = p.Series()
		case textparse.EntryHistogram:
			_, ts, smp.H, smp.FH = p.Histogram()
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
		p.Labels(&smp.Labels)
		smp.Meta = s.metaFor(smp.Labels.Get(model.MetricNameLabel))
		if err := s.fn(smp); err != nil {
			return err
		}
	}
}
