package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"
)

// TestEraseReachesEveryReplica: an erasure posted to one of three receiver
// replicas (real binaries, each with all three as peers, itself included as
// a headless Service lists it), while the third is stopped, is repeated on
// the second: the answer names the second's job and says the stopped one
// is retried; both jobs finish; the cluster is gone from both and refused
// by both. Once the third is back, the retry gives it the job too: the
// cluster is gone from its data and refused. A re-admission posted to one
// re-admits it on all three.
func TestEraseReachesEveryReplica(t *testing.T) {
	dir := t.TempDir()
	replicaToken := filepath.Join(dir, "replica-token")
	require.NoError(t, os.WriteFile(replicaToken, []byte("r3plica-t0ken\n"), 0o600))
	aAddr, bAddr, cAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	start := func(name, addr string) *Process {
		rdir := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(rdir, 0o755))
		cfg := writeReceiverConfig(t, rdir, "", "")
		tokens := fmt.Sprintf("tokens:\n- token: %q\n  tenant: acme\n- token: %q\n  tenant: acme\n  allow: [admin, read]\n", tokenAcme, tokenAdmin)
		require.NoError(t, os.WriteFile(filepath.Join(rdir, "tokens.yaml"), []byte(tokens), 0o600))
		appendPeers(t, cfg, []string{aAddr, bAddr, cAddr}, replicaToken, "")
		return startReceiver(t, cfg, filepath.Join(rdir, "data"), "--web.listen-address="+addr)
	}
	a, b, c := start("a", aAddr), start("b", bAddr), start("c", cAddr)

	const gone = "e2e-erase-every-replica-77c1"
	now := time.Now()
	write := func(p *Process, cluster string) (int, string) {
		body := encodeWrite(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{{
			Labels:  labelsOf("__name__", "erase_samples", "_id", cluster),
			Samples: []prompb.Sample{{Timestamp: now.UnixMilli(), Value: 1}},
		}}})
		code, msg, err := postWrite(http.DefaultClient, p.URL(), tokenAcme, body, nil)
		require.NoError(t, err)
		return code, msg
	}
	for _, p := range []*Process{a, b, c} {
		for _, cluster := range []string{gone, "keep-" + p.Addr} {
			code, msg := write(p, cluster)
			require.Equal(t, http.StatusNoContent, code, msg)
		}
	}
	require.Len(t, countSamples(t, a.URL(), tokenAcme, "erase_samples", "5m", now), 4, "the replicas' data, through the peers")
	c.Stop() // its head, the cluster's samples included, is in its blocks now

	code, resp := adminPost(t, a.URL(), tokenAdmin, "/api/v1/admin/erase", map[string]string{"cluster_id": gone, "requested_by": "ticket-42"})
	require.Equal(t, http.StatusAccepted, code, resp)
	var answer struct {
		Data struct {
			ID       string `json:"id"`
			Replicas []struct {
				Replica, Job, Error string
			} `json:"replicas"`
		} `json:"data"`
		Warnings []string `json:"warnings"`
	}
	raw, err := json.Marshal(resp)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &answer))
	require.Len(t, answer.Data.Replicas, 2, "b and the stopped c, not a itself: %s", raw)
	jobs := map[string]string{aAddr: answer.Data.ID}
	for _, r := range answer.Data.Replicas {
		switch r.Replica {
		case bAddr:
			require.Empty(t, r.Error)
			jobs[bAddr] = r.Job
		case cAddr:
			require.NotEmpty(t, r.Error)
		default:
			t.Fatalf("unexpected replica %q in %s", r.Replica, raw)
		}
	}
	require.Len(t, answer.Warnings, 1)
	require.Contains(t, answer.Warnings[0], "replica "+cAddr+" did not take it")
	require.Contains(t, answer.Warnings[0], "this replica retries it there for up to 1h0m0s")

	for _, p := range []*Process{a, b} {
		id := jobs[p.Addr]
		require.NotEmpty(t, id)
		eventually(t, 60*time.Second, func() error {
			job, err := eraseStatus(t, p.URL(), id)
			if err != nil {
				return err
			}
			if job.State != "done" {
				return fmt.Errorf("%s: job %+v", p.Addr, job)
			}
			return nil
		})
	}

	// Gone from both (each asked for the fleet, peers included), refused by both.
	for _, p := range []*Process{a, b} {
		got := countSamples(t, p.URL(), tokenAcme, "erase_samples", "5m", now)
		require.Equal(t, map[string]string{"keep-" + aAddr: "1", "keep-" + bAddr: "1"}, got, p.Addr)
		code, msg := write(p, gone)
		require.Equal(t, http.StatusBadRequest, code, msg)
		require.Contains(t, msg, "erased")
	}

	// c, back at its address, gets the erasure from a's retry and runs it.
	c = start("c", cAddr)
	eventually(t, 3*time.Minute, func() error {
		code, resp := apiGet(t, c.URL(), tokenAdmin, "/api/v1/admin/erase", nil)
		if code != http.StatusOK {
			return fmt.Errorf("job list: %d %s", code, resp.Error)
		}
		var jobs []eraseJob
		if err := json.Unmarshal(resp.Data, &jobs); err != nil {
			return err
		}
		if len(jobs) != 1 || jobs[0].State != "done" || jobs[0].ClusterSHA256 == "" {
			return fmt.Errorf("c's jobs: %+v", jobs)
		}
		return nil
	})
	got := countSamples(t, c.URL(), tokenAcme, "erase_samples", "5m", now)
	require.Equal(t, map[string]string{"keep-" + aAddr: "1", "keep-" + bAddr: "1", "keep-" + cAddr: "1"}, got)
	code, msg := write(c, gone)
	require.Equal(t, http.StatusBadRequest, code, msg)
	require.Contains(t, msg, "erased")
	var delivered bool
	for _, l := range a.Logs() {
		delivered = delivered || strings.Contains(l, `"msg":"admin call repeated on a replica that had missed it"`) && strings.Contains(l, cAddr)
	}
	require.True(t, delivered, "a logs the retry that reached c")
	var repeated bool
	for _, l := range b.Logs() {
		repeated = repeated || strings.Contains(l, `"msg":"erasure requested"`) && strings.Contains(l, "repeated by the replica at") &&
			strings.Contains(l, `"requested_by":"ticket-42"`)
	}
	require.True(t, repeated, "b's audit event names the repeat")

	// Re-admitted on all three by one call.
	code, resp = adminPost(t, b.URL(), tokenAdmin, "/api/v1/admin/readmit", map[string]string{"cluster_id": gone})
	require.Equal(t, http.StatusOK, code, resp)
	raw, err = json.Marshal(resp["data"])
	require.NoError(t, err)
	require.Contains(t, string(raw), fmt.Sprintf(`{"readmitted":true,"replica":%q}`, aAddr))
	require.Contains(t, string(raw), fmt.Sprintf(`{"readmitted":true,"replica":%q}`, cAddr))
	for _, p := range []*Process{a, b, c} {
		code, msg := write(p, gone)
		require.Equal(t, http.StatusNoContent, code, "%s: %s", p.Addr, msg)
	}
}
