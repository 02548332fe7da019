package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/auth"
	"github.com/phonehome/phonehome/relabel"
)

// docShellBlock returns the ```sh block of the Markdown file doc that
// contains marker, its list-item indentation removed.
func docShellBlock(t *testing.T, doc, marker string) string {
	t.Helper()
	b, err := os.ReadFile(doc)
	require.NoError(t, err)
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		m := fence.FindStringSubmatch(lines[i])
		if m == nil || m[2] != "sh" {
			continue
		}
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, strings.TrimPrefix(lines[i], m[1]))
		}
		if s := strings.Join(body, "\n") + "\n"; strings.Contains(s, marker) {
			return s
		}
	}
	t.Fatalf("%s: no sh block with %q", doc, marker)
	return ""
}

// TestDocClusterIDHashCommand: the command of docs/migrating-from-telemeter.md
// computes the receiver's auth.cluster_id_hash pseudonym of a raw id, also
// for the keys it names: a NUL byte, an inner newline, a Windows line end.
func TestDocClusterIDHashCommand(t *testing.T) {
	for _, tool := range []string{"bash", "openssl", "od", "basenc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed (.ci/run installs it)", tool)
		}
	}
	script := docShellBlock(t, "../docs/migrating-from-telemeter.md", "openssl dgst")
	const raw = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"
	for name, key := range map[string]string{
		"text":             "0123456789abcdef0123456789abcdef\n",
		"NUL byte":         "ab\x00cd-0123456789abcdef",
		"inner newline":    "0123456789\nabcdef0123456789",
		"Windows line end": "0123456789abcdef0123456789\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "cluster-id-key")
			require.NoError(t, os.WriteFile(path, []byte(key), 0o600))
			h, err := auth.LoadClusterIDHasher(path)
			require.NoError(t, err)

			cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "RAW_CLUSTER_ID="+raw)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			require.Equal(t, h.Pseudonym(raw), strings.TrimSpace(string(out)))
		})
	}
}

// TestDocForwarderPseudonymCommand: the forwarder command of
// docs/lifecycle.md ("Which _id") names the cluster's pseudonym in its first
// log line.
func TestDocForwarderPseudonymCommand(t *testing.T) {
	script := docShellBlock(t, "../docs/lifecycle.md", "--anonymize-salt-file=salt")
	require.True(t, strings.HasPrefix(script, "forwarder "), "%q", script)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatal("bash not installed")
	}
	bin := binaries(t)
	dir := t.TempDir()
	salt := "0123456789abcdef0123456789abcdef"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "salt"), []byte(salt+"\n"), 0o600))
	const raw = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", "exec "+filepath.Join(bin, "forwarder")+strings.TrimPrefix(script, "forwarder"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "RAW_CLUSTER_ID="+raw, "TMPDIR="+dir) // the command's mktemp -d
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	sc := bufio.NewScanner(stderr)
	require.True(t, sc.Scan(), "no log line: %v", sc.Err())
	var line struct {
		Msg       string `json:"msg"`
		ClusterID string `json:"cluster_id"`
	}
	require.NoError(t, json.Unmarshal(sc.Bytes(), &line), "%s", sc.Bytes())
	require.Equal(t, "cluster pseudonym", line.Msg, "%s", sc.Bytes())
	require.Equal(t, relabel.Anonymize([]byte(salt), raw), line.ClusterID)
}
