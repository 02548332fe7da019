package receive

import (
	"errors"
	"fmt"
	"slices"
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
