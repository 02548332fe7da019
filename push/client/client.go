// Package client is the installer's telemetry client for phonehome's
// aggregation push endpoint (see package push). A run collects label values
// as they become known, then pushes once at the end:
//
//	tc := client.New(client.Options{URL: "https://phonehome.example", Token: token})
//	inv := tc.Counter("cluster_installation_invocation", "Installer invocations.")
//	inv.AddLabelValue("command", "create").AddLabelValue("platform", "aws")
//	...
//	inv.AddDuration("duration", time.Since(start)) // bucketed to Options.DurationStep
//	if err := tc.Push(ctx); err != nil {
//		logger.Debug("telemetry not sent", "err", err) // never fatal
//	}
//
// The client never blocks or fails its caller: Push has a short total
// timeout, returns errors as values and recovers from panics. Setting the
// environment variable PHONEHOME_TELEMETRY_DISABLED (to anything but "", "0"
// or "false") or Options.Disabled turns it off; a disabled client sends
// nothing.
package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// EnvDisabled is the opt-out environment variable.
const EnvDisabled = "PHONEHOME_TELEMETRY_DISABLED"

// Defaults.
const (
	DefaultJob          = "installer"
	DefaultTimeout      = 5 * time.Second
	DefaultDurationStep = 150 * time.Second // 2.5 minutes
)

// Options configure a Client. Only URL is required (without it the client
// is disabled).
type Options struct {
	URL      string            // receiver base URL, e.g. https://phonehome.example:9291
	Token    string            // bearer token (with the write permission)
	Job      string            // the job grouping label; default "installer"
	Grouping map[string]string // extra grouping labels (part of every series)
	// Timeout bounds one Push in total (connect, send, answer). Default 5s.
	Timeout time.Duration
	// DurationStep is the bucket width of AddDuration. Default 2.5m.
	DurationStep time.Duration
	// Disabled turns the client off, as the environment variable does.
	Disabled bool
	// HTTPClient sends the push; default a private client whose idle
	// connections are closed after each push.
	HTTPClient *http.Client
	// Getenv reads the environment; default os.Getenv (tests override it).
	Getenv func(string) string
}

// Client collects counters during a run and pushes them. It is safe for
// concurrent use. The zero Client and a nil *Client are disabled.
type Client struct {
	opts     Options
	disabled bool
	private  bool // HTTPClient is ours

	mu      sync.Mutex
	metrics []*Metric
}

// New returns a client. It does no I/O.
func New(opts Options) *Client {
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	if opts.Job == "" {
		opts.Job = DefaultJob
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.DurationStep <= 0 {
		opts.DurationStep = DefaultDurationStep
	}
	c := &Client{opts: opts, disabled: opts.Disabled || opts.URL == "" || optedOut(opts.Getenv(EnvDisabled))}
	if c.opts.HTTPClient == nil {
		c.opts.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		c.private = true
	}
	return c
}

func optedOut(v string) bool {
	v = strings.TrimSpace(strings.ToLower(v))
	return v != "" && v != "0" && v != "false" && v != "no"
}

// Enabled reports whether Push will send anything.
func (c *Client) Enabled() bool { return c != nil && c.opts.URL != "" && !c.disabled }

// Counter returns the counter called name, creating it with value 1 (one
// run). Calling it again with the same name returns the same counter.
func (c *Client) Counter(name, help string) *Metric {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.metrics {
		if m.name == name {
			return m
		}
	}
	m := &Metric{name: name, help: help, value: 1, labels: map[string]string{}, step: c.opts.DurationStep}
	c.metrics = append(c.metrics, m)
	return m
}

// Metric is one counter of a run. Its methods are safe for concurrent use,
// chainable and no-ops on a nil *Metric.
type Metric struct {
	name, help string
	step       time.Duration

	mu     sync.Mutex
	labels map[string]string
	value  float64
}

// AddLabelValue sets label name to value (the last call wins).
func (m *Metric) AddLabelValue(name, value string) *Metric {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.labels[name] = value
	return m
}

// AddDuration sets label name to d bucketed to the client's step (see
// DurationBucket), which bounds the label's cardinality.
func (m *Metric) AddDuration(name string, d time.Duration) *Metric {
	if m == nil {
		return nil
	}
	return m.AddLabelValue(name, DurationBucket(d, m.step))
}

// SetValue sets the counter's increment for this run (default 1).
func (m *Metric) SetValue(v float64) *Metric {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.value = v
	return m
}

// DurationBucket renders d rounded up to a multiple of step, in minutes:
// with a 2.5m step, 23m10s is "25" and 2m is "2.5" (the bucket is (22.5, 25]).
// Zero and negative durations are "0".
func DurationBucket(d, step time.Duration) string {
	if d <= 0 || step <= 0 {
		return "0"
	}
	n := math.Ceil(float64(d) / float64(step))
	return strconv.FormatFloat(n*step.Minutes(), 'f', -1, 64)
}

// Push sends every counter once, with the total timeout of
// Options.Timeout (or ctx's deadline, if earlier). It returns nil on success
// and when the client is disabled. It never panics and returns no later
// than the timeout even if the transport ignores cancellation.
func (c *Client) Push(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("telemetry push: panic: %v", r)
		}
	}()
	if !c.Enabled() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	done := make(chan error, 1) // buffered: a late sender never blocks
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("telemetry push: panic: %v", r)
			}
		}()
		done <- c.push(ctx)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("telemetry push: %w", ctx.Err())
	}
}

func (c *Client) push(ctx context.Context) error {
	body, err := c.encode()
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url(), bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("telemetry push: %w", err)
	}
	req.Header.Set("Content-Type", string(expfmt.NewFormat(expfmt.TypeProtoDelim)))
	if c.opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.Token)
	}
	if c.private {
		defer c.opts.HTTPClient.CloseIdleConnections()
	}
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("telemetry push: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("telemetry push: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

// encode renders every counter as delimited protobuf.
func (c *Client) encode() ([]byte, error) {
	c.mu.Lock()
	ms := slices.Clone(c.metrics)
	c.mu.Unlock()
	if len(ms) == 0 {
		return nil, errors.New("telemetry push: no metrics")
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeProtoDelim))
	for _, m := range ms {
		m.mu.Lock()
		mf := &dto.MetricFamily{
			Name:   &m.name,
			Help:   &m.help,
			Type:   dto.MetricType_COUNTER.Enum(),
			Metric: []*dto.Metric{{Counter: &dto.Counter{Value: &m.value}}},
		}
		names := make([]string, 0, len(m.labels))
		for n := range m.labels {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			mf.Metric[0].Label = append(mf.Metric[0].Label, &dto.LabelPair{Name: &n, Value: new(m.labels[n])})
		}
		err := enc.Encode(mf)
		m.mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("telemetry push: encode %s: %w", m.name, err)
		}
	}
	return buf.Bytes(), nil
}

// url is the Pushgateway-style path: /metrics/job/<job>{/<label>/<value>},
// base64url-encoding values that are empty or contain a slash, and "." and
// "..", which a server's path cleaning would remove (Go's ServeMux answers a
// redirect, which turns the push into a GET).
func (c *Client) url() string {
	var b strings.Builder
	b.WriteString(strings.TrimSuffix(c.opts.URL, "/"))
	b.WriteString("/metrics")
	seg := func(name, value string) {
		if value == "" || value == "." || value == ".." || strings.Contains(value, "/") {
			b.WriteString("/" + name + "@base64/")
			if value == "" {
				b.WriteString("=")
			} else {
				b.WriteString(base64.RawURLEncoding.EncodeToString([]byte(value)))
			}
			return
		}
		b.WriteString("/" + name + "/" + url.PathEscape(value))
	}
	seg("job", c.opts.Job)
	names := make([]string, 0, len(c.opts.Grouping))
	for n := range c.opts.Grouping {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		seg(n, c.opts.Grouping[n])
	}
	return b.String()
}
