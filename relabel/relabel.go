// Package relabel rewrites the labels of forwarded series: metric renames,
// extra labels, Prometheus relabel_configs, and keyed anonymization of the
// cluster identity and of chosen label values. Pure: no I/O, no globals.
package relabel

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strings"
	"sync"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	promrelabel "github.com/prometheus/prometheus/model/relabel"
)

// IDLabel is the label that carries the (anonymized) cluster identity.
const IDLabel = "_id"

// MinSaltBytes is the shortest accepted anonymization salt.
const MinSaltBytes = 16

// Config describes the rewriting. It is validated and compiled by Parse.
type Config struct {
	// ID is the raw cluster id. When set, every series gets IDLabel set to
	// Anonymize(Salt, ID), replacing any IDLabel it had; the raw value is also
	// scrubbed from every other label value (defence in depth).
	ID string
	// Salt is the per-cluster secret HMAC key. Required (at least MinSaltBytes)
	// when ID or AnonymizeLabels is set.
	Salt []byte
	// AnonymizeLabels are label names whose values are replaced by their keyed hash.
	AnonymizeLabels []string
	// Rename maps metric names to new names (telemeter's --rename, ALERTS=alerts).
	Rename map[string]string
	// ExternalLabels are set on every series (the --label flag); they override
	// labels of the same name from the source.
	ExternalLabels map[string]string
	// RelabelConfigs are standard Prometheus relabel_configs, applied after the
	// renames and external labels and before anonymization.
	RelabelConfigs []*promrelabel.Config
}

// Rules is a compiled, immutable Config. Safe for concurrent use.
type Rules struct {
	id        string // raw id, only used to scrub it out
	hashedID  string
	salt      []byte
	anonymize []string
	rename    map[string]string
	external  labels.Labels
	configs   []*promrelabel.Config
	pool      sync.Pool // of hash.Hash (HMAC-SHA256 keyed with salt)
}

// Parse validates c and compiles it. It reports every problem, each prefixed
// with the name of the setting it concerns. The Rules do not retain c's slices
// or maps.
func Parse(c Config) (*Rules, error) {
	var errs []error
	needSalt := c.ID != "" || len(c.AnonymizeLabels) > 0
	if needSalt && len(c.Salt) < MinSaltBytes {
		errs = append(errs, fmt.Errorf("anonymize salt: %d bytes, need at least %d (required with an id or anonymized labels)", len(c.Salt), MinSaltBytes))
	}
	for i, n := range c.AnonymizeLabels {
		if !model.UTF8Validation.IsValidLabelName(n) || n == "" {
			errs = append(errs, fmt.Errorf("anonymize_labels[%d] %q: invalid label name", i, n))
		}
		if n == model.MetricNameLabel {
			errs = append(errs, fmt.Errorf("anonymize_labels[%d] %q: the metric name cannot be anonymized", i, n))
		}
	}
	for from, to := range c.Rename {
		if !model.UTF8Validation.IsValidMetricName(from) || !model.UTF8Validation.IsValidMetricName(to) || from == "" || to == "" {
			errs = append(errs, fmt.Errorf("rename %q=%q: invalid metric name", from, to))
		}
	}
	b := labels.NewScratchBuilder(len(c.ExternalLabels))
	for k, v := range c.ExternalLabels {
		switch {
		case k == "" || !model.UTF8Validation.IsValidLabelName(k):
			errs = append(errs, fmt.Errorf("label %q: invalid label name", k))
		case k == model.MetricNameLabel || k == IDLabel:
			errs = append(errs, fmt.Errorf("label %q: reserved label name", k))
		case v == "":
			errs = append(errs, fmt.Errorf("label %q: empty value", k))
		}
		b.Add(k, v)
	}
	b.Sort()
	configs := make([]*promrelabel.Config, 0, len(c.RelabelConfigs))
	for i, rc := range c.RelabelConfigs {
		if rc == nil {
			errs = append(errs, fmt.Errorf("relabel_configs[%d]: empty", i))
			continue
		}
		cp := *rc
		if err := cp.Validate(model.UTF8Validation); err != nil {
			errs = append(errs, fmt.Errorf("relabel_configs[%d]: %w", i, err))
			continue
		}
		configs = append(configs, &cp)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	r := &Rules{
		id:        c.ID,
		salt:      append([]byte(nil), c.Salt...),
		anonymize: append([]string(nil), c.AnonymizeLabels...),
		rename:    make(map[string]string, len(c.Rename)),
		external:  b.Labels(),
		configs:   configs,
	}
	for k, v := range c.Rename {
		r.rename[k] = v
	}
	r.pool.New = func() any { return hmac.New(sha256.New, r.salt) }
	if c.ID != "" {
		r.hashedID = r.Hash(c.ID)
	}
	return r, nil
}

// HashedID returns the anonymized cluster id ("" when no id is configured).
func (r *Rules) HashedID() string { return r.hashedID }

// Hash returns the keyed hash of v with the Rules' salt (see Anonymize).
func (r *Rules) Hash(v string) string {
	h := r.pool.Get().(hash.Hash)
	defer r.pool.Put(h)
	return encode(h, v)
}

// Anonymize returns the keyed, irreversible pseudonym of value under salt:
//
//	base64url-unpadded( HMAC-SHA256(key=salt, message=value)[:16] )
//
// i.e. 22 characters of [A-Za-z0-9_-]. Truncating to 128 bits keeps labels
// short; the chance that any two of n distinct values collide is below
// n²/2^129 (about 1.5e-27 for a million clusters, 1.5e-21 for a billion values),
// and without the salt an observer cannot test guesses of the raw value.
func Anonymize(salt []byte, value string) string {
	return encode(hmac.New(sha256.New, salt), value)
}

func encode(h hash.Hash, v string) string {
	h.Reset()
	_, _ = h.Write([]byte(v))
	var sum [sha256.Size]byte
	d := h.Sum(sum[:0])
	return base64.RawURLEncoding.EncodeToString(d[:16])
}

// AnonymizesLabels reports whether the Rules hash the values of any label
// besides IDLabel: then a text written for a whole metric family (its help)
// may quote a raw value that Apply hashes in one of its series.
func (r *Rules) AnonymizesLabels() bool { return len(r.anonymize) > 0 }

// ScrubText replaces the raw id in free text (metadata help and unit) with
// its hash, so the raw id cannot leave through anything but labels either.
func (r *Rules) ScrubText(s string) string {
	if r.id == "" || !strings.Contains(s, r.id) {
		return s
	}
	return strings.ReplaceAll(s, r.id, r.hashedID)
}

// Apply rewrites lb in this order: metric rename, external labels, IDLabel,
// relabel_configs, anonymization of AnonymizeLabels, IDLabel again (so no
// relabel rule can forge or remove it), and finally scrubbing of the raw id
// from every label value. It returns false if the series must be dropped (a
// relabel rule dropped it or it lost its metric name).
func (r *Rules) Apply(lb *labels.Builder) bool {
	if to, ok := r.rename[lb.Get(model.MetricNameLabel)]; ok {
		lb.Set(model.MetricNameLabel, to)
	}
	r.external.Range(func(l labels.Label) { lb.Set(l.Name, l.Value) })
	if r.id != "" {
		lb.Set(IDLabel, r.hashedID)
	}
	if len(r.configs) > 0 && !promrelabel.ProcessBuilder(lb, r.configs...) {
		return false
	}
	if len(r.anonymize) > 0 {
		h := r.pool.Get().(hash.Hash)
		for _, n := range r.anonymize {
			if v := lb.Get(n); v != "" {
				hashed := encode(h, v)
				lb.Set(n, hashed)
				scrub(lb, v, hashed) // the same raw value inside another label
			}
		}
		r.pool.Put(h)
	}
	if r.id != "" {
		lb.Set(IDLabel, r.hashedID)
		scrub(lb, r.id, r.hashedID)
	}
	return lb.Get(model.MetricNameLabel) != ""
}

// MinScrubLen keeps scrubbing from rewriting unrelated values: a raw value
// this short (e.g. "1") is too common to be an identity worth hiding inside
// other labels, while its own label is still hashed. The receiver replaces
// a raw cluster id inside label values from the same length.
const MinScrubLen = 4

// scrub replaces raw inside every label value of lb with hashed
// (defence in depth: e.g. instance="host-a:9100" when host is anonymized).
func scrub(lb *labels.Builder, raw, hashed string) {
	if len(raw) < MinScrubLen {
		return
	}
	var leaks []labels.Label
	lb.Range(func(l labels.Label) {
		if strings.Contains(l.Value, raw) {
			leaks = append(leaks, l)
		}
	})
	for _, l := range leaks {
		lb.Set(l.Name, strings.ReplaceAll(l.Value, raw, hashed))
	}
}
