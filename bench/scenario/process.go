package scenario

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// server is a started child process. It runs in its own process group and is
// killed (SIGKILL) if the harness dies, so nothing outlives a run.
type server struct {
	name    string
	cmd     *exec.Cmd
	baseURL string
	done    chan struct{}
	waitErr error
}

// startServer starts path with args, logging its stdout and stderr to logPath.
// If listenFromLog is set, the listen address is taken from the JSON
// {"msg":"listening","addr":...} line; otherwise addr must be given. It then
// waits until GET /-/ready answers 200.
// onPID, if not nil, is called with the process id right after the start.
func startServer(ctx context.Context, name, path string, args []string, logPath, addr string, listenFromLog bool, onPID func(int), env []string) (*server, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		_ = logf.Close()
		return nil, err
	}
	cmd := exec.Command(path, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		_ = pr.Close()
		_ = pw.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	_ = pw.Close()
	if onPID != nil {
		onPID(cmd.Process.Pid)
	}
	s := &server{name: name, cmd: cmd, done: make(chan struct{})}

	addrc := make(chan string, 1)
	var logWG sync.WaitGroup
	logWG.Go(func() {
		defer logf.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = logf.Write(append(line, '\n'))
			var rec struct{ Msg, Addr string }
			if listenFromLog && json.Unmarshal(line, &rec) == nil && rec.Msg == "listening" && rec.Addr != "" {
				select {
				case addrc <- rec.Addr:
				default:
				}
			}
		}
		_, _ = io.Copy(logf, pr)
	})
	go func() {
		s.waitErr = cmd.Wait()
		logWG.Wait()
		close(s.done)
	}()

	if listenFromLog {
		select {
		case addr = <-addrc:
		case <-s.done:
			return nil, fmt.Errorf("%s exited before listening (%w); see %s", name, s.waitErr, logPath)
		case <-time.After(10 * time.Minute): // a WAL replay comes first
			s.kill()
			return nil, fmt.Errorf("%s did not log a listen address; see %s", name, logPath)
		case <-ctx.Done():
			s.kill()
			return nil, ctx.Err()
		}
	}
	s.baseURL = "http://" + addr
	if err := s.waitReady(ctx, 10*time.Minute); err != nil {
		s.kill()
		return nil, fmt.Errorf("%w; see %s", err, logPath)
	}
	return s, nil
}

func (s *server) pid() int { return s.cmd.Process.Pid }

func (s *server) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.baseURL+"/-/ready", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.done:
			return fmt.Errorf("%s exited while waiting for readiness: %w", s.name, s.waitErr)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready after %s", s.name, timeout)
}

// stop sends SIGTERM and waits up to timeout, then kills. It returns the
// process's exit error (nil for exit code 0) and how long the stop took.
func (s *server) stop(timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		return time.Since(start), s.waitErr
	case <-time.After(timeout):
		s.kill()
		return time.Since(start), fmt.Errorf("%s did not exit within %s of SIGTERM; killed", s.name, timeout)
	}
}

// kill kills the process group and waits for it to be reaped. Safe to call
// more than once and after the process exited.
func (s *server) kill() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
	}
}

// freeAddr returns a loopback address with a port that was free a moment ago
// (for programs, like Prometheus, that cannot report the port they bound).
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// procMem is a reading of /proc/<pid>/status in bytes.
type procMem struct{ rss, hwm int64 }

func readProcMem(pid int) (procMem, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procMem{}, err
	}
	var m procMem
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &m.rss
		case "VmHWM":
			dst = &m.hwm
		default:
			continue
		}
		f := strings.Fields(v) // "123456 kB"
		if len(f) == 2 && f[1] == "kB" {
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err == nil {
				*dst = n << 10
			}
		}
	}
	if m.rss == 0 {
		return m, errors.New("no VmRSS in /proc status")
	}
	return m, nil
}

// cpuSeconds returns utime+stime of pid from /proc/<pid>/stat.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces; fields after ')' are fixed.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	const clkTck = 100 // USER_HZ on Linux
	return (ut + st) / clkTck, nil
}

// RSSPoint is one memory reading of a server.
type RSSPoint struct {
	T   float64 `json:"t_s"` // seconds since the server started being measured
	RSS int64   `json:"rss_bytes"`
}

// sampler reads a process's RSS periodically until stopped.
type sampler struct {
	start  time.Time // T = offset + time since start
	mu     sync.Mutex
	points []RSSPoint
	max    int64
	stopc  chan struct{}
	wg     sync.WaitGroup
}

func startSampler(pid int, every time.Duration, offset float64) *sampler {
	start := time.Now()
	s := &sampler{stopc: make(chan struct{}), start: start}
	s.wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if m, err := readProcMem(pid); err == nil {
				s.mu.Lock()
				s.points = append(s.points, RSSPoint{T: offset + time.Since(start).Seconds(), RSS: m.rss})
				s.max = max(s.max, m.rss)
				s.mu.Unlock()
			}
			select {
			case <-s.stopc:
				return
			case <-t.C:
			}
		}
	})
	return s
}

func (s *sampler) stop() ([]RSSPoint, int64) {
	close(s.stopc)
	s.wg.Wait()
	return s.points, s.max
}
