package receive

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/common/model"
)

// RemoteWriteConfig configures the remote-write endpoint.
type RemoteWriteConfig struct {
	// AcceptedProtobufMessages are the remote-write versions accepted, by
	// protobuf message name, as Prometheus'
	// --web.remote-write-receiver.accepted-protobuf-messages: by default
	// both prometheus.WriteRequest (1.0) and io.prometheus.write.v2.Request
	// (2.0). A request with another one is answered 415, so 2.0 senders fall
	// back to 1.0.
	AcceptedProtobufMessages []string `yaml:"accepted_protobuf_messages"`
}

// SetDefaults fills every unset field.
func (c *RemoteWriteConfig) SetDefaults() {
	if len(c.AcceptedProtobufMessages) == 0 {
		c.AcceptedProtobufMessages = []string{protoV1, protoV2}
	}
}

// Validate reports every problem with its YAML path.
func (c *RemoteWriteConfig) Validate() error {
	var errs []error
	for i, m := range c.AcceptedProtobufMessages {
		switch {
		case m != protoV1 && m != protoV2:
			errs = append(errs, fmt.Errorf("remote_write.accepted_protobuf_messages[%d]: %q, want %s or %s", i, m, protoV1, protoV2))
		case slices.Index(c.AcceptedProtobufMessages, m) != i:
			errs = append(errs, fmt.Errorf("remote_write.accepted_protobuf_messages[%d]: %q is listed twice", i, m))
		}
	}
	return errors.Join(errs...)
}

// TelemeterPathsConfig is the top-level telemeter: section: how Telemeter's
// paths (/upload and /metrics/v1/receive) treat the Prometheus replica label.
type TelemeterPathsConfig struct {
	// ReplicaLabel is removed on both paths, and on remote-write one
	// replica per cluster is written (telemeter.go). Unset means
	// prometheus_replica; "" turns it off.
	ReplicaLabel *string `yaml:"replica_label"`
	// ReplicaFailoverTimeout: the elected replica silent this long, another
	// takes over.
	ReplicaFailoverTimeout model.Duration `yaml:"replica_failover_timeout"`
}

// SetDefaults fills every unset field.
func (c *TelemeterPathsConfig) SetDefaults() {
	if c.ReplicaLabel == nil {
		l := DefaultReplicaLabel
		c.ReplicaLabel = &l
	}
	if c.ReplicaFailoverTimeout == 0 {
		c.ReplicaFailoverTimeout = model.Duration(DefaultReplicaFailover)
	}
}

// Validate reports every problem with its YAML path.
func (c *TelemeterPathsConfig) Validate() error {
	var errs []error
	if l := c.ReplicaLabel; l != nil && *l != "" && !model.LegacyValidation.IsValidLabelName(*l) {
		errs = append(errs, fmt.Errorf("telemeter.replica_label: %q is not a valid label name", *l))
	}
	if c.ReplicaFailoverTimeout < model.Duration(time.Second) {
		errs = append(errs, fmt.Errorf("telemeter.replica_failover_timeout: %s is shorter than 1s", c.ReplicaFailoverTimeout))
	}
	return errors.Join(errs...)
}

// Options is the section as the Handler takes it.
func (c *TelemeterPathsConfig) Options() TelemeterOptions {
	o := TelemeterOptions{ReplicaFailover: time.Duration(c.ReplicaFailoverTimeout)}
	if c.ReplicaLabel != nil {
		o.ReplicaLabel = *c.ReplicaLabel
	}
	return o
}
