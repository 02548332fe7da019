// Package e2e starts the real binaries (and real Prometheus, Alertmanager and
// S3 servers) on loopback and checks them end to end. It is part of `make test`
// and never skips: CI installs every program it needs.
package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/stretchr/testify/require"
)

// binDir holds the binaries built once by TestMain.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "phonehome-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	if err := buildBinaries(dir + string(os.PathSeparator)); err != nil {
		fmt.Fprintln(os.Stderr, "build binaries:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildBinaries builds the commands into dir as they ship: the receiver
// with the labels implementation these tests are built with (make test
// passes the Makefile's RECEIVER_TAGS, as the image build does), the
// forwarder with Go's default. Each is built once.
func buildBinaries(dir string) error {
	receiver := []string{"build", "-race", "-o", dir, "../cmd/receiver"}
	if labels.ImplementationName != "stringlabels" {
		receiver = slices.Insert(receiver, 2, "-tags="+labels.ImplementationName)
	}
	builds := [][]string{receiver, {"build", "-race", "-o", dir, "../cmd/forwarder"}}
	for _, args := range builds {
		build := exec.Command("go", args...)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
		}
	}
	return nil
}

// Process is a started binary. Stop sends SIGINT and waits; Kill sends SIGKILL.
type Process struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	Addr string // the address it logged as "listening"

	done     chan struct{}
	stopOnce sync.Once
	exitErr  error

	logMu sync.Mutex
	logs  []string // every line of output so far
}

// Logs returns every line the process has written so far.
func (p *Process) Logs() []string {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	return append([]string(nil), p.logs...)
}

// startBinary starts one of our binaries with args, waits for its "listening"
// log line and returns it. At cleanup it is interrupted and must exit 0.
func startBinary(t *testing.T, name string, args ...string) *Process {
	t.Helper()
	return startProcess(t, filepath.Join(binDir, name), name, args, listeningFromJSON)
}

// startProcess runs path and waits until match finds the listen address in a
// line of its stderr.
func startProcess(t *testing.T, path, name string, args []string, match func(line string) (string, bool)) *Process {
	t.Helper()
	p, addrc := launchProcess(t, path, name, args, match)
	p.waitListening(addrc)
	return p
}

// launchProcess starts path and returns at once; waitListening then waits
// for the address match finds (match sees every line of output). Split so
// that several processes can be started at the same instant.
func launchProcess(t *testing.T, path, name string, args []string, match func(line string) (string, bool)) (*Process, <-chan string) {
	t.Helper()
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	cmd := exec.Command(path, args...)
	cmd.Stderr = pw
	cmd.Stdout = pw
	require.NoError(t, cmd.Start(), "start %s", name)
	_ = pw.Close()

	p := &Process{t: t, name: name, cmd: cmd, done: make(chan struct{})}
	addrc := make(chan string, 1)
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			t.Logf("%s: %s", name, line)
			p.logMu.Lock()
			p.logs = append(p.logs, line)
			p.logMu.Unlock()
			if addr, ok := match(line); ok {
				select {
				case addrc <- addr:
				default:
				}
			}
		}
		// A line over the scanner's limit ends the loop: keep draining, or
		// the child blocks writing to a full pipe and never exits.
		_, _ = io.Copy(io.Discard, pr)
		_ = pr.Close()
	}()
	go func() {
		p.exitErr = cmd.Wait()
		<-logged // all output read before anyone looks at the exit
		close(p.done)
	}()
	t.Cleanup(func() { p.Stop() })
	return p, addrc
}

// waitListening waits for the address launchProcess' match found.
func (p *Process) waitListening(addrc <-chan string) {
	p.t.Helper()
	select {
	case p.Addr = <-addrc:
	case <-p.done:
		p.t.Fatalf("%s exited before listening: %v", p.name, p.exitErr)
	case <-time.After(60 * time.Second):
		p.t.Fatalf("%s did not log a listen address", p.name)
	}
}

func listeningFromJSON(line string) (string, bool) {
	var rec struct{ Msg, Addr string }
	if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" && rec.Addr != "" {
		return rec.Addr, true
	}
	return "", false
}

// Stop interrupts the process and requires a clean exit.
func (p *Process) Stop() {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(90 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			p.t.Errorf("%s did not stop within 90s of SIGINT", p.name)
			return
		}
		if p.exitErr != nil {
			p.t.Errorf("%s did not exit cleanly: %v", p.name, p.exitErr)
		}
	})
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Process) Kill() {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
}

// URL is the process' base URL.
func (p *Process) URL() string { return "http://" + p.Addr }

// startPrometheus runs Debian's Prometheus with the given configuration on a
// free loopback port, waits until it is ready and returns it.
func startPrometheus(t *testing.T, config string, extraArgs ...string) *Process {
	t.Helper()
	return startPrometheusAt(t, freeAddr(t), config, extraArgs...)
}

// startPrometheusAt is startPrometheus on a given address, for
// configurations that must name Prometheus' own address (self-scrape).
func startPrometheusAt(t *testing.T, addr, config string, extraArgs ...string) *Process {
	t.Helper()
	p := launchPrometheusAt(t, addr, config, extraArgs...)
	waitHTTP(t, p.URL()+"/-/ready", http.StatusOK)
	return p
}

// launchPrometheusAt is startPrometheusAt up to the log line that says
// Prometheus serves: the caller waits for readiness (over TLS, say).
func launchPrometheusAt(t *testing.T, addr, config string, extraArgs ...string) *Process {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(config), 0o600))
	args := append([]string{
		"--config.file=" + cfgPath,
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr,
		"--log.format=json",
	}, extraArgs...)
	return startProcess(t, "/usr/bin/prometheus", "prometheus", args, func(line string) (string, bool) {
		return addr, strings.Contains(line, "Server is ready to receive web requests")
	})
}

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// waitHTTP polls url until it answers want, or fails the test after a minute.
func waitHTTP(t *testing.T, url string, want int) {
	t.Helper()
	eventually(t, time.Minute, func() error {
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			return fmt.Errorf("GET %s: %d, want %d", url, resp.StatusCode, want)
		}
		return nil
	})
}

// eventually polls f every 100ms until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("condition not met within %v: %v", timeout, err)
}
