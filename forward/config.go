package forward

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/alecthomas/units"
	"github.com/prometheus/common/model"
	promrelabel "github.com/prometheus/prometheus/model/relabel"

	"github.com/phonehome/phonehome/internal/strictyaml"
)

// FileConfig is the forwarder's --config.file. Every field is optional; flags
// given on the command line take precedence where both exist. An absent key
// keeps its default (DefaultFileConfig is applied before decoding), so a 0
// written in the file is meant: a jitter of 0 turns that jitter off (see
// JitterOption). Collections are always spread by ±10 % of --interval. Example:
//
//	matches:                    # added to --match and --match-file
//	  - '{__name__="up"}'
//	anonymize_labels: [namespace] # added to --anonymize-labels
//	relabel_configs:            # Prometheus relabel_configs, applied before anonymization;
//	  - action: labeldrop       # --elide-label's labels (default prometheus and
//	    regex: endpoint         # prometheus_replica) are removed after them
//	federate:
//	  max_series: 50000         # per cycle, after the allowlist; 0 = no cap
//	  max_bytes: 64MiB          # response bytes kept per cycle; 0 = no cap
//	  timeout: 1m
//	  cache_series: 100000      # series whose filtering and relabeling are remembered
//	                            # across cycles (a few hundred bytes of heap each,
//	                            # ~0.6 KiB of RSS at 100k); 0 = no cache
//	send:
//	  max_samples_per_request: 2000
//	  timeout: 30s
//	  min_backoff: 1s
//	  max_backoff: 1m
//	  flush_timeout: 10s        # last delivery attempt at shutdown
//	queue:
//	  max_bytes: 256MiB         # overridden by --queue.max-bytes
//	  segment_bytes: 16MiB
//	authorize:                  # the /authorize exchange (see --authorize)
//	  renew_at: 0.8             # renew after this fraction of a credential's lifetime
//	  jitter: 0.1               # ... minus up to this fraction, at random; 0 = off
//	  min_backoff: 1s           # retries of a failed exchange
//	  max_backoff: 1m
//	  timeout: 30s
//	gathering:                  # polling of --gathering-url
//	  interval: 2h
//	  jitter: 0.1               # each wait is interval ± jitter×interval; 0 = off
//	  timeout: 30s
//	  cache_file: ""            # default <queue.dir>/gathering-definition.json
type FileConfig struct {
	Matches         []string              `yaml:"matches"`
	AnonymizeLabels []string              `yaml:"anonymize_labels"`
	RelabelConfigs  []*promrelabel.Config `yaml:"relabel_configs"`
	Federate        FederateConfig        `yaml:"federate"`
	Send            SendConfig            `yaml:"send"`
	Queue           QueueConfig           `yaml:"queue"`
	Authorize       AuthorizeConfig       `yaml:"authorize"`
	Gathering       GatheringConfig       `yaml:"gathering"`
}

// AuthorizeConfig tunes the credential exchange at the receiver's /authorize.
type AuthorizeConfig struct {
	RenewAt    float64        `yaml:"renew_at"`
	Jitter     float64        `yaml:"jitter"`
	MinBackoff model.Duration `yaml:"min_backoff"`
	MaxBackoff model.Duration `yaml:"max_backoff"`
	Timeout    model.Duration `yaml:"timeout"`
}

// GatheringConfig tunes the polling of the fleet's gathering definition.
type GatheringConfig struct {
	Interval  model.Duration `yaml:"interval"`
	Jitter    float64        `yaml:"jitter"`
	Timeout   model.Duration `yaml:"timeout"`
	CacheFile string         `yaml:"cache_file"`
}

// FederateConfig bounds one federation.
type FederateConfig struct {
	MaxSeries   int              `yaml:"max_series"`
	MaxBytes    units.Base2Bytes `yaml:"max_bytes"`
	Timeout     model.Duration   `yaml:"timeout"`
	CacheSeries int              `yaml:"cache_series"`
}

// SeriesCacheSize is Options.SeriesCacheSize for c.CacheSeries.
func (c FederateConfig) SeriesCacheSize() int {
	if c.CacheSeries == 0 {
		return -1 // off
	}
	return c.CacheSeries
}

// SendConfig tunes delivery.
type SendConfig struct {
	MaxSamplesPerRequest int            `yaml:"max_samples_per_request"`
	Timeout              model.Duration `yaml:"timeout"`
	MinBackoff           model.Duration `yaml:"min_backoff"`
	MaxBackoff           model.Duration `yaml:"max_backoff"`
	FlushTimeout         model.Duration `yaml:"flush_timeout"`
}

// QueueConfig sizes the on-disk queue.
type QueueConfig struct {
	MaxBytes     units.Base2Bytes `yaml:"max_bytes"`
	SegmentBytes units.Base2Bytes `yaml:"segment_bytes"`
}

// DefaultFileConfig is applied before decoding.
func DefaultFileConfig() FileConfig {
	return FileConfig{
		Federate: FederateConfig{Timeout: model.Duration(time.Minute), CacheSeries: defaultSeriesCacheSize},
		Send: SendConfig{
			MaxSamplesPerRequest: 2000,
			Timeout:              model.Duration(30 * time.Second),
			MinBackoff:           model.Duration(time.Second),
			MaxBackoff:           model.Duration(time.Minute),
			FlushTimeout:         model.Duration(10 * time.Second),
		},
		Queue: QueueConfig{MaxBytes: 256 * units.MiB},
		Authorize: AuthorizeConfig{
			RenewAt: 0.8, Jitter: 0.1,
			MinBackoff: model.Duration(time.Second), MaxBackoff: model.Duration(time.Minute),
			Timeout: model.Duration(30 * time.Second),
		},
		Gathering: GatheringConfig{
			Interval: model.Duration(2 * time.Hour), Jitter: 0.1, Timeout: model.Duration(30 * time.Second),
		},
	}
}

// LoadFileConfig reads path strictly (unknown keys are errors), applies
// defaults and validates. An empty path yields the defaults.
func LoadFileConfig(path string) (FileConfig, error) {
	if path == "" {
		return DefaultFileConfig(), nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return FileConfig{}, fmt.Errorf("read config: %w", err)
	}
	return ParseFileConfig(b)
}

// ParseFileConfig is LoadFileConfig for bytes.
func ParseFileConfig(b []byte) (FileConfig, error) {
	c := DefaultFileConfig()
	if err := strictyaml.Decode(b, &c); err != nil && !errors.Is(err, io.EOF) {
		return FileConfig{}, fmt.Errorf("decode config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return FileConfig{}, err
	}
	return c, nil
}

// Validate reports every problem, each prefixed with its YAML path. The
// relabel configs are validated by relabel.Parse, which main calls with the
// merged flags.
func (c *FileConfig) Validate() error {
	var errs []error
	if c.Federate.MaxSeries < 0 {
		errs = append(errs, errors.New("federate.max_series: must not be negative"))
	}
	if c.Federate.CacheSeries < 0 {
		errs = append(errs, errors.New("federate.cache_series: must not be negative"))
	}
	if c.Federate.MaxBytes < 0 {
		errs = append(errs, errors.New("federate.max_bytes: must not be negative"))
	}
	if c.Federate.Timeout <= 0 {
		errs = append(errs, errors.New("federate.timeout: must be positive"))
	}
	if c.Send.MaxSamplesPerRequest <= 0 {
		errs = append(errs, errors.New("send.max_samples_per_request: must be positive"))
	}
	for name, d := range map[string]model.Duration{
		"send.timeout": c.Send.Timeout, "send.min_backoff": c.Send.MinBackoff,
		"send.max_backoff": c.Send.MaxBackoff, "send.flush_timeout": c.Send.FlushTimeout,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive", name))
		}
	}
	if c.Send.MaxBackoff < c.Send.MinBackoff {
		errs = append(errs, errors.New("send.max_backoff: must not be below send.min_backoff"))
	}
	if c.Queue.MaxBytes < 64*units.KiB {
		errs = append(errs, errors.New("queue.max_bytes: must be at least 64KiB"))
	}
	if c.Queue.SegmentBytes < 0 || (c.Queue.SegmentBytes > 0 && c.Queue.SegmentBytes > c.Queue.MaxBytes) {
		errs = append(errs, errors.New("queue.segment_bytes: must be between 0 (auto) and queue.max_bytes"))
	}
	if a := c.Authorize; a.RenewAt <= 0 || a.RenewAt >= 1 {
		errs = append(errs, fmt.Errorf("authorize.renew_at: %v, want a fraction in (0, 1)", a.RenewAt))
	} else if a.Jitter < 0 || a.Jitter >= a.RenewAt {
		errs = append(errs, fmt.Errorf("authorize.jitter: %v, want a fraction in [0, renew_at)", a.Jitter))
	}
	for name, d := range map[string]model.Duration{
		"authorize.min_backoff": c.Authorize.MinBackoff, "authorize.max_backoff": c.Authorize.MaxBackoff,
		"authorize.timeout": c.Authorize.Timeout, "gathering.timeout": c.Gathering.Timeout,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive", name))
		}
	}
	if c.Authorize.MaxBackoff < c.Authorize.MinBackoff {
		errs = append(errs, errors.New("authorize.max_backoff: must not be below authorize.min_backoff"))
	}
	if c.Gathering.Interval < model.Duration(time.Second) {
		errs = append(errs, fmt.Errorf("gathering.interval: %s is shorter than 1s", c.Gathering.Interval))
	}
	if c.Gathering.Jitter < 0 || c.Gathering.Jitter >= 1 {
		errs = append(errs, fmt.Errorf("gathering.jitter: %v, want a fraction in [0, 1)", c.Gathering.Jitter))
	}
	for i, rc := range c.RelabelConfigs {
		if rc == nil {
			errs = append(errs, fmt.Errorf("relabel_configs[%d]: empty", i))
		}
	}
	return errors.Join(errs...)
}
