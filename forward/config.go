package forward

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/alecthomas/units"
	"github.com/prometheus/common/model"
	promrelabel "github.com/prometheus/prometheus/model/relabel"
	"go.yaml.in/yaml/v3"
)

// FileConfig is the forwarder's --config.file. Every field is optional; flags
// given on the command line take precedence where both exist. Example:
//
//	matches:                    # added to --match and --match-file
//	  - '{__name__="up"}'
//	anonymize_labels: [namespace] # added to --anonymize-labels
//	relabel_configs:            # Prometheus relabel_configs, applied before anonymization
//	  - action: labeldrop
//	    regex: prometheus_replica
//	federate:
//	  max_series: 50000         # per cycle, after the allowlist; 0 = no cap
//	  max_bytes: 64MiB          # response bytes kept per cycle; 0 = no cap
//	  timeout: 1m
//	send:
//	  max_samples_per_request: 2000
//	  timeout: 30s
//	  min_backoff: 1s
//	  max_backoff: 1m
//	  flush_timeout: 10s        # last delivery attempt at shutdown
//	queue:
//	  max_bytes: 256MiB         # overridden by --queue.max-bytes
//	  segment_bytes: 16MiB
type FileConfig struct {
	Matches         []string              `yaml:"matches"`
	AnonymizeLabels []string              `yaml:"anonymize_labels"`
	RelabelConfigs  []*promrelabel.Config `yaml:"relabel_configs"`
	Federate        FederateConfig        `yaml:"federate"`
	Send            SendConfig            `yaml:"send"`
	Queue           QueueConfig           `yaml:"queue"`
}

// FederateConfig bounds one federation.
type FederateConfig struct {
	MaxSeries int              `yaml:"max_series"`
	MaxBytes  units.Base2Bytes `yaml:"max_bytes"`
	Timeout   model.Duration   `yaml:"timeout"`
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
		Federate: FederateConfig{Timeout: model.Duration(time.Minute)},
		Send: SendConfig{
			MaxSamplesPerRequest: 2000,
			Timeout:              model.Duration(30 * time.Second),
			MinBackoff:           model.Duration(time.Second),
			MaxBackoff:           model.Duration(time.Minute),
			FlushTimeout:         model.Duration(10 * time.Second),
		},
		Queue: QueueConfig{MaxBytes: 256 * units.MiB},
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
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
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
	for i, rc := range c.RelabelConfigs {
		if rc == nil {
			errs = append(errs, fmt.Errorf("relabel_configs[%d]: empty", i))
		}
	}
	return errors.Join(errs...)
}
