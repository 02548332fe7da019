package erasure

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/phonehome/phonehome/peers"
)

// Replicas repeats admin calls on the receiver's other replicas (*peers.Set).
// Each replica holds a cluster in its own head, disk and deny list, so an
// erasure or a re-admission submitted to one replica is submitted to every
// replica it can reach, and the answer says what each did; a Repeater
// retries it on those that did not take it.
type Replicas interface {
	Broadcast(ctx context.Context, path, authorization string, body []byte) []peers.Answer
	// Peers lists the peers a Broadcast calls now.
	Peers() []string
	// Repeat makes a Broadcast's call on the one peer at addr.
	Repeat(ctx context.Context, addr, path, authorization string, body []byte) peers.Answer
}

// ReplicaResult is what another replica did with a repeated call.
type ReplicaResult struct {
	Replica string `json:"replica"`
	// Job is the replica's erasure job, to follow with GET
	// /api/v1/admin/erase/<job> on that replica.
	Job string `json:"job,omitempty"`
	// Readmitted is the replica's answer to a re-admission.
	Readmitted *bool  `json:"readmitted,omitempty"`
	Error      string `json:"error,omitempty"`
}

// outcome is how a replica's answer to a repeated call ends its repeats.
type outcome string

const (
	delivered outcome = "delivered" // it took the call (2xx)
	refused   outcome = "refused"   // a 4xx that a retry would not change
	failed    outcome = "failed"    // no answer, 5xx, 408 or 429: retried
	itself    outcome = ""          // the peer is this receiver
)

// replicaResult reads a replica's answer to a repeated call (the envelope
// of respond, an erasure's job or a re-admission's result, or apiError)
// and tells whether to retry it.
func replicaResult(a peers.Answer) (ReplicaResult, outcome) {
	res := ReplicaResult{Replica: a.Peer}
	if a.Peer == "" {
		return res, itself
	}
	if a.Err != nil {
		res.Error = a.Err.Error()
		return res, failed
	}
	var env envelope[struct {
		ID         string `json:"id"`
		Readmitted *bool  `json:"readmitted"`
	}]
	err := json.Unmarshal(a.Body, &env)
	switch {
	case a.Code/100 != 2 && env.Error != "":
		res.Error = fmt.Sprintf("%d: %s", a.Code, env.Error)
	case a.Code/100 != 2:
		res.Error = fmt.Sprintf("answered %d", a.Code)
	case err != nil: // taken, whatever it said
		res.Error = fmt.Sprintf("undecodable answer: %v", err)
		return res, delivered
	default:
		res.Job, res.Readmitted = env.Data.ID, env.Data.Readmitted
		return res, delivered
	}
	switch {
	case a.Code == http.StatusRequestTimeout, a.Code == http.StatusTooManyRequests, a.Code/100 != 4:
		return res, failed
	default:
		return res, refused
	}
}
