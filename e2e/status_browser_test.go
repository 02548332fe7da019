package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/prometheus/prompb"
	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/relabel"
)

// The fleet status page in a real browser (Debian's chromium, driven by
// chromedp): a real forwarder and a load generator writing 60 clusters
// report to a real receiver; an operator logs in with a read token, finds
// the clusters on the overview, searches one, opens it and sees its chart,
// and the refusal reason of a cluster pushed over its series limit.
// Another tenant's token sees none of it; no token sees the login page.
//
// PHONEHOME_SCREENSHOTS=<dir> writes status-overview.png and
// status-cluster.png there (docs/ holds the README's).
func TestStatusPageBrowser(t *testing.T) {
	chromium := findChromium(t)
	const (
		readToken  = "fleet-read-token"
		loadToken  = "fleet-load-token"
		otherToken = "other-read-token"
		clusters   = 60
	)
	hashedID := relabel.Anonymize([]byte(fwdSalt), fwdClusterID)
	dir := t.TempDir()
	tokens := fmt.Sprintf(`tokens:
- token: %q
  tenant: fleet
  cluster_id: %q
  allow: [write]
- token: %q
  tenant: fleet
  allow: [read]
- token: %q
  tenant: fleet
  allow: [write]
- token: %q
  tenant: other
  allow: [read, write]
`, fwdToken, hashedID, readToken, loadToken, otherToken)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.yaml"), []byte(tokens), 0o600))
	cfg := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("auth:\n  tokens_file: tokens.yaml\nlimits:\n  defaults:\n    max_series_per_cluster: 250\n"), 0o600))
	recv := startReceiver(t, cfg, filepath.Join(dir, "data"))

	// The real forwarder, federating the fixture cluster (224 series).
	fed := fixtureFederate(t)
	_ = startBinary(t, "forwarder", forwarderArgs(t, fed.URL, recv.URL(), filepath.Join(dir, "queue"), "--interval=2s")...)

	// The load generator: 60 clusters of 20 series, and one pushed over its
	// 250-series limit, all with the tenant's unbound write token.
	now := time.Now().UnixMilli()
	for c := range clusters {
		mustWrite(t, recv.URL(), loadToken, loadRequest(fmt.Sprintf("load-%03d", c), 20, now))
	}
	code, body, err := postWrite(http.DefaultClient, recv.URL(), loadToken, encodeWrite(t, loadRequest("load-noisy", 300, now)), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "max_series_per_cluster")

	// Without a token the API answers 401, and the page holds no data.
	resp, err := http.Get(recv.URL() + "/api/v1/status/overview")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	ctx := browser(t, chromium)
	require.NoError(t, doT(ctx, chromedp.Navigate(recv.URL()+"/"), chromedp.WaitVisible(chromedp.CSS("#token"))))
	loginVisible := evalJS[bool](t, ctx, `!document.getElementById('login').hidden`)
	viewText := evalJS[string](t, ctx, `document.getElementById('view').innerText`)
	require.True(t, loginVisible, "no token: the login page")
	require.Empty(t, strings.TrimSpace(viewText), "no token: no data")

	// Log in; the overview counts the forwarder's cluster and the load's.
	login(t, ctx, readToken)
	want := fmt.Sprint(clusters + 2) // the load, the noisy one, the forwarder's
	eventuallyText(t, ctx, time.Minute, "#cluster-cards .card:first-child .big", func(s string) bool { return s == want }, true)
	overview := evalJS[string](t, ctx, `document.getElementById('view').innerText`)
	require.Contains(t, overview, "series_limit", "refused in the last hour, by reason")
	require.Contains(t, overview, "phonehome-forwarder/", "the forwarder's version")
	charts := evalJS[int](t, ctx, `document.querySelectorAll('svg.chart').length`)
	require.Equal(t, 3, charts)
	screenshot(t, ctx, "status-overview.png")

	// Search for the forwarder's cluster by a prefix of its _id, open it.
	prefix := hashedID[:6]
	require.NoError(t, doT(ctx,
		chromedp.Navigate(recv.URL()+"/#/clusters"),
		chromedp.WaitVisible(chromedp.CSS("#search")),
		chromedp.SendKeys(chromedp.CSS("#search"), prefix),
		chromedp.Click(chromedp.CSS(`#search-form button[type="submit"]`)),
	))
	eventuallyText(t, ctx, 30*time.Second, "#matched", func(s string) bool { return strings.HasPrefix(s, "1 of ") }, true)
	require.NoError(t, doT(ctx,
		chromedp.Click(chromedp.CSS(`#clusters tbody a`)),
		chromedp.WaitVisible(chromedp.CSS("#cluster-charts")),
	))
	eventually(t, time.Minute, func() error {
		points := evalJS[[]int](t, ctx,
			`[...document.querySelectorAll('#cluster-charts polyline')].map(p => p.getAttribute('points').trim().split(' ').filter(Boolean).length)`)
		nonzero := evalJS[bool](t, ctx,
			`[...document.querySelectorAll('#cluster-charts polyline')].some(p => p.getAttribute('points').split(' ').some(xy => xy && Number(xy.split(',')[1]) < 132))`)
		if len(points) != 2 || points[0] < 2 || !nonzero {
			_ = doT(ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#cluster-charts")))
			return fmt.Errorf("chart points %v, any above zero: %v", points, nonzero)
		}
		return nil
	})
	detail := evalJS[string](t, ctx, `document.getElementById('view').innerText`)
	require.Contains(t, detail, hashedID)
	require.Contains(t, detail, "cluster_version", "series per metric name")
	screenshot(t, ctx, "status-cluster.png")

	// The cluster over its limit shows the reason and the refused series.
	require.NoError(t, doT(ctx, chromedp.Navigate(recv.URL()+"/#/cluster/load-noisy")))
	eventuallyText(t, ctx, 30*time.Second, "#refusals", func(s string) bool {
		return strings.Contains(s, "series_limit") && strings.Contains(s, `_id="load-noisy"`)
	}, true)

	// Another tenant's token sees none of it.
	require.NoError(t, doT(ctx, chromedp.Click(chromedp.CSS("#logout")), chromedp.WaitVisible(chromedp.CSS("#token"))))
	require.NoError(t, doT(ctx, chromedp.Navigate(recv.URL()+"/#/"), chromedp.WaitVisible(chromedp.CSS("#token"))))
	login(t, ctx, otherToken)
	eventuallyText(t, ctx, 30*time.Second, "#cluster-cards .card:first-child .big", func(s string) bool { return s == "0" }, true)
	require.NoError(t, doT(ctx, chromedp.Navigate(recv.URL()+"/#/clusters")))
	eventuallyText(t, ctx, 30*time.Second, "#matched", func(s string) bool { return strings.HasPrefix(s, "0 of 0 ") }, true)
	require.NoError(t, doT(ctx, chromedp.Navigate(recv.URL()+"/#/cluster/load-noisy")))
	eventuallyText(t, ctx, 30*time.Second, "#view", func(s string) bool { return strings.Contains(s, "not found") }, true)
	leaked := evalJS[bool](t, ctx, `document.body.innerText.includes('load-0') || document.body.innerText.includes(`+"`"+hashedID+"`"+`)`)
	require.False(t, leaked)

	// A restart keeps the history: the refusals of the last hour are still
	// counted by the next process, whose own counters start at 0.
	recv.Stop()
	history, err := os.ReadFile(filepath.Join(dir, "data", "status", "history.json"))
	require.NoError(t, err)
	require.Contains(t, string(history), `"fleet"`)
	require.NotContains(t, string(history), "load-noisy", "the history holds totals, no cluster")
	recv = startReceiver(t, cfg, filepath.Join(dir, "data"))
	req, err := http.NewRequest(http.MethodGet, recv.URL()+"/api/v1/status/overview", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+readToken)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var overviewAfter struct {
		Data struct {
			RefusedLastHour map[string]uint64 `json:"refused_last_hour"`
		}
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&overviewAfter))
	require.Positive(t, overviewAfter.Data.RefusedLastHour["series_limit"], "refusals before the restart forgotten")
}

// doT runs steps with a timeout; on failure the error carries the page's text.
func doT(ctx context.Context, steps ...chromedp.Action[chromedp.Void]) error {
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := chromedp.Do(tctx, steps...)
	if err != nil {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		text, _ := chromedp.Run(pctx, chromedp.Evaluate[string](`location.href + '\n' + document.body.innerText`))
		return fmt.Errorf("%w; page: %s", err, text)
	}
	return nil
}

// evalJS evaluates expr in the page.
func evalJS[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(tctx, chromedp.Evaluate[T](expr))
	require.NoError(t, err, expr)
	return v
}

func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found: the status page test needs Debian's chromium (apt-get install chromium; .ci/run installs it)")
	return ""
}

// browser starts a headless chromium for the test.
func browser(t *testing.T, path string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // the tests may run as root
		chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-gpu", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelC(); cancelA() })
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	return ctx
}

func login(t *testing.T, ctx context.Context, token string) {
	t.Helper()
	require.NoError(t, doT(ctx,
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS(`#login-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#cluster-cards")),
	))
	inURL := evalJS[bool](t, ctx, `location.href.includes(`+fmt.Sprintf("%q", token)+`)`)
	require.False(t, inURL, "the token never goes into a URL")
}

// eventuallyText polls the text of sel until ok, re-rendering the page
// (hashchange) between tries when rerender is set.
func eventuallyText(t *testing.T, ctx context.Context, timeout time.Duration, sel string, ok func(string) bool, rerender bool) {
	t.Helper()
	eventually(t, timeout, func() error {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			return err
		}
		if !ok(strings.TrimSpace(s)) {
			if rerender {
				_, _ = chromedp.Run(ctx, chromedp.Evaluate[bool](`window.dispatchEvent(new HashChangeEvent('hashchange'))`))
			}
			return fmt.Errorf("%s: %q", sel, s)
		}
		return nil
	})
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NotEmpty(t, png)
	dir := os.Getenv("PHONEHOME_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
}

// loadRequest is one load-generator cluster's write: series gauges.
func loadRequest(cluster string, series int, ts int64) *prompb.WriteRequest {
	req := &prompb.WriteRequest{}
	for i := range series {
		req.Timeseries = append(req.Timeseries, prompb.TimeSeries{
			Labels:  labelsOf("__name__", "load_gauge", "_id", cluster, "series", fmt.Sprint(i)),
			Samples: []prompb.Sample{{Value: float64(i), Timestamp: ts}},
		})
	}
	return req
}

var trailingTimestamp = regexp.MustCompile(`(?m)^([^#\s][^\n]*?\s+\S+)\s+-?\d+$`)

// fixtureFederate serves the fixture as a /federate answer, without its
// fixed (2026-01-01) timestamps, so the forwarder stamps the collection time.
func fixtureFederate(t *testing.T) *httptest.Server {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fwdFixtures, "federate-sample.prom"))
	require.NoError(t, err)
	b = trailingTimestamp.ReplaceAll(b, []byte("$1"))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv
}
