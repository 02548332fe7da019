package erasure

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/phonehome/phonehome/peers"
)

// Replicas repeats admin calls on the receiver's other replicas (package
// peers). Each replica holds a cluster in its own head, disk and deny list,
// so an erasure or a re-admission submitted to one replica is submitted to
// every replica it can reach, and the answer says what each did.
type Replicas interface {
	Broadcast(ctx context.Context, path, authorization string, body []byte) []peers.Answer
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

// repeat submits req to the other replicas unless r was itself repeated by
// one, and returns their results and a warning for each replica that did not
// take it. The calls outlive a caller that goes away (each is bounded by
// peers.timeout): the job here is taken, and the other replicas' must be too.
func repeat(r *http.Request, replicas Replicas, path string, req Request) ([]ReplicaResult, []string) {
	if replicas == nil || r.Header.Get(peers.OriginHeader) != "" {
		return nil, nil
	}
	body, err := json.Marshal(req)
	if err != nil { // a Request always marshals
		return nil, []string{"not repeated on the other replicas: " + err.Error()}
	}
	var (
		results  []ReplicaResult
		warnings []string
	)
	for _, a := range replicas.Broadcast(context.WithoutCancel(r.Context()), path, r.Header.Get("Authorization"), body) {
		res := replicaResult(a)
		if res.Error != "" {
			warnings = append(warnings, fmt.Sprintf("replica %s did not take it (%s): send it to that replica again", a.Peer, res.Error))
		}
		results = append(results, res)
	}
	return results, warnings
}

// replicaResult reads a replica's answer to a repeated call: the envelope
// of respond (an erasure's job or a re-admission's result) or apiError.
func replicaResult(a peers.Answer) ReplicaResult {
	res := ReplicaResult{Replica: a.Peer}
	if a.Err != nil {
		res.Error = a.Err.Error()
		return res
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
	case err != nil:
		res.Error = fmt.Sprintf("undecodable answer: %v", err)
	default:
		res.Job, res.Readmitted = env.Data.ID, env.Data.Readmitted
	}
	return res
}
