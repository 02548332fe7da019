package deploy

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/phonehome/phonehome/webtls"
	"github.com/phonehome/phonehome/webtls/webtlstest"
)

// docExample is one ```yaml block of a Markdown file.
type docExample struct {
	where string // file:line
	body  string
}

var fence = regexp.MustCompile("^(\\s*)```(\\S*)\\s*$")

// docExamples returns every ```yaml block of the user-facing docs, with the
// block's indentation (a block inside a list item) removed.
func docExamples(t *testing.T) []docExample {
	t.Helper()
	files := []string{"../README.md"}
	docs, err := filepath.Glob("../docs/*.md")
	require.NoError(t, err)
	files = append(files, docs...)
	var out []docExample
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		lines := strings.Split(string(b), "\n")
		for i := 0; i < len(lines); i++ {
			m := fence.FindStringSubmatch(lines[i])
			if m == nil || m[2] == "" {
				continue
			}
			start, indent, lang := i+1, len(m[1]), m[2]
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			}
			require.Less(t, i, len(lines), "%s:%d: unterminated code block", f, start)
			if lang != "yaml" && lang != "yml" {
				continue
			}
			var body []string
			for _, l := range lines[start:i] {
				if len(l) >= indent {
					l = l[indent:]
				}
				body = append(body, l)
			}
			out = append(out, docExample{where: fmt.Sprintf("%s:%d", strings.TrimPrefix(f, "../"), start), body: strings.Join(body, "\n") + "\n"})
		}
	}
	return out
}

// receiverSections are the top-level keys of the receiver's configuration.
var receiverSections = []string{"auth", "limits", "allowlist", "elide_labels", "storage", "push", "rules", "bucket_store", "compactor", "upstream", "remote_write", "telemeter", "gathering", "peers"}

// TestDocExamplesPassCheckConfig runs every YAML example of README.md and
// docs/*.md through the binary that reads it: receiver configuration
// fragments (with a tokens file added) and the forwarder's configuration
// through --check-config, the tokens, keys and gathering definition examples
// as the files a receiver configuration names, the web config through the
// validation both binaries run at start. The files an example names are
// created, absolute paths moved under a temporary directory. An example of a
// kind this test does not know fails it: teach it the kind.
func TestDocExamplesPassCheckConfig(t *testing.T) {
	bin := binaries(t)
	examples := docExamples(t)
	require.GreaterOrEqual(t, len(examples), 10)

	// The README's gathering definition, tokens and keys examples serve the
	// receiver fragments that name such files.
	var definition, tokens, keys string
	for _, ex := range examples {
		switch keysOf(t, ex) {
		case "selectors,version", "anonymize_labels,max_series,min_forwarder_version,selectors,version":
			definition = ex.body
		case "tokens":
			tokens = ex.body
		case "keys":
			keys = ex.body
		}
	}
	require.NotEmpty(t, definition, "no gathering definition example")
	require.NotEmpty(t, tokens, "no tokens file example")
	require.NotEmpty(t, keys, "no keys file example")

	checked := map[string]int{}
	for _, ex := range examples {
		t.Run(ex.where, func(t *testing.T) {
			top := strings.Split(keysOf(t, ex), ",")
			dir := t.TempDir()
			switch {
			case slices.Equal(top, []string{"tokens"}):
				// Entries elided with "..." are placeholders.
				var doc struct {
					Tokens []map[string]any `yaml:"tokens"`
				}
				require.NoError(t, yaml.Unmarshal([]byte(ex.body), &doc))
				var kept []map[string]any
				for _, e := range doc.Tokens {
					if !strings.Contains(fmt.Sprint(e), "...") {
						kept = append(kept, e)
					}
				}
				require.NotEmpty(t, kept)
				b, err := yaml.Marshal(map[string]any{"tokens": kept})
				require.NoError(t, err)
				checkReceiver(t, bin, dir, "", string(b), "", definition)
				checked["tokens"]++
			case slices.Equal(top, []string{"keys"}):
				checkReceiver(t, bin, dir, "auth:\n  keys_file: keys.yaml\n", "", ex.body, definition)
				checked["keys"]++
			case slices.Contains(top, "version") && slices.Contains(top, "selectors"):
				checkReceiver(t, bin, dir, "gathering:\n  file: gathering.yaml\n", "", "", ex.body)
				checked["gathering definition"]++
			case slices.Equal(top, []string{"tls_server_config"}):
				ca := webtlstest.NewCA(t, "example")
				cert, key := ca.Server(t, "receiver")
				y := strings.NewReplacer(
					"/etc/phonehome/tls/tls.crt", cert,
					"/etc/phonehome/tls/tls.key", key,
					"/etc/phonehome/tls/clients-ca.crt", ca.File,
				).Replace(ex.body)
				require.NotEqual(t, ex.body, y, "the example's paths changed: update this test")
				p := filepath.Join(dir, "web-config.yaml")
				require.NoError(t, os.WriteFile(p, []byte(y), 0o600))
				require.NoError(t, webtls.ValidateWebConfig(p, webtls.ServerOptions{}))
				checked["web config"]++
			case slices.Contains(top, "scrape_configs"):
				checkPrometheusConfig(t, dir, ex)
				checked["prometheus config"]++
			case slices.Contains(top, "matches") || slices.Contains(top, "relabel_configs") || slices.Contains(top, "federate"):
				p := filepath.Join(dir, "forwarder.yaml")
				require.NoError(t, os.WriteFile(p, []byte(ex.body), 0o600))
				salt := filepath.Join(dir, "salt")
				require.NoError(t, os.WriteFile(salt, []byte("0123456789abcdef-salt\n"), 0o600))
				args := []string{"--to=http://127.0.0.1:1", "--from=http://127.0.0.1:2", "--id=abc", "--match=up",
					"--anonymize-salt-file=" + salt, "--queue.dir=" + filepath.Join(dir, "queue"), "--config.file=" + p, "--check-config"}
				out, err := exec.Command(filepath.Join(bin, "forwarder"), args...).CombinedOutput()
				require.NoError(t, err, "forwarder --check-config:\n%s\n%s", out, ex.body)
				require.Contains(t, string(out), "ok")
				checked["forwarder"]++
			default:
				for _, k := range top {
					require.Contains(t, receiverSections, k, "%s: an example of a kind this test does not know:\n%s", ex.where, ex.body)
				}
				checkReceiver(t, bin, dir, ex.body, "", "", definition)
				checked["receiver"]++
			}
		})
	}
	t.Logf("checked: %v", checked)
	require.GreaterOrEqual(t, checked["receiver"], 8, "%v", checked)
	require.Equal(t, 1, checked["forwarder"], "%v", checked)
	require.Equal(t, 1, checked["prometheus config"], "%v", checked)
}

// checkPrometheusConfig runs promtool check config on a Prometheus
// configuration example. Each rule file it loads must be one of
// deploy/prometheus (copied to where it names), and the jobs those rules
// select must be scrape jobs of the example.
func checkPrometheusConfig(t *testing.T, dir string, ex docExample) {
	t.Helper()
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName string `yaml:"job_name"`
		} `yaml:"scrape_configs"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(ex.body), &cfg))
	var jobs []string
	for _, sc := range cfg.ScrapeConfigs {
		jobs = append(jobs, sc.JobName)
	}
	body := ex.body
	for _, rf := range cfg.RuleFiles {
		b, err := os.ReadFile(filepath.Join("prometheus", filepath.Base(rf)))
		require.NoError(t, err, "%s: rule file %s is not one of deploy/prometheus", ex.where, rf)
		for _, m := range jobMatcher.FindAllStringSubmatch(string(b), -1) {
			require.Contains(t, jobs, m[1], "%s: %s selects a job the example does not scrape", ex.where, rf)
		}
		p := filepath.Join(dir, rf)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, b, 0o600))
		if filepath.IsAbs(rf) {
			body = strings.ReplaceAll(body, rf, p)
		}
	}
	p := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	out, err := exec.Command(promtool, "check", "config", p).CombinedOutput()
	require.NoError(t, err, "%s: promtool check config:\n%s\n%s", ex.where, out, body)
}

// keysOf returns the sorted top-level keys of an example.
func keysOf(t *testing.T, ex docExample) string {
	t.Helper()
	var m map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(ex.body), &m), "%s: not YAML:\n%s", ex.where, ex.body)
	require.NotEmpty(t, m, "%s: empty example", ex.where)
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return strings.Join(ks, ",")
}

// checkReceiver runs receiver --check-config on cfg (a configuration
// fragment) in dir, with auth.tokens_file added (tokens, or one token), the
// keys file (keys, with a generated key for each PEM it names) and every
// other file the fragment names created: a gathering definition for
// gathering's files, a rule file for each rules.files glob, 32 bytes for the
// rest. Absolute paths are moved under dir. POD_NAME is set, as in the
// StatefulSet.
func checkReceiver(t *testing.T, bin, dir, cfg, tokens, keys, definition string) {
	t.Helper()
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal([]byte(cfg), &doc))
	if len(doc.Content) == 0 {
		doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode}}}
	}
	root := doc.Content[0]
	write := func(name, data string) string {
		if filepath.IsAbs(name) {
			name = filepath.Join(dir, name)
		}
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(data), 0o600))
		return name
	}
	var walk func(key string, n *yaml.Node)
	walk = func(key string, n *yaml.Node) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i].Value, n.Content[i+1]
				switch {
				case key == "gathering" && k == "file", key == "gathering.tenants":
					v.Value = write(v.Value, definition)
				case key == "rules" && k == "files":
					for _, g := range v.Content {
						write(strings.ReplaceAll(g.Value, "*", "example"), "groups: []\n")
					}
				case k == "keys_file":
					if keys == "" {
						keys = "keys: []\n"
					}
					v.Value = write(v.Value, keys)
				case strings.HasSuffix(k, "_file") && v.Kind == yaml.ScalarNode && v.Value != "":
					v.Value = write(v.Value, strings.Repeat("s", 32)+"\n")
				default:
					walk(strings.TrimPrefix(key+"."+k, "."), v)
				}
			}
		case yaml.SequenceNode:
			for _, e := range n.Content {
				walk(key, e)
			}
		}
	}
	walk("", root)
	// The keys file's PEMs.
	var kf struct {
		Keys []struct {
			PrivateKeyFile string `yaml:"private_key_file"`
		} `yaml:"keys"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(keys), &kf))
	for _, k := range kf.Keys {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		der, err := x509.MarshalPKCS8PrivateKey(priv)
		require.NoError(t, err)
		write(k.PrivateKeyFile, string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})))
	}
	// auth.tokens_file, unless the fragment names one.
	if tokens == "" {
		tokens = "tokens:\n  - token: example\n    tenant: fleet\n"
	}
	var auth *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "auth" {
			auth = root.Content[i+1]
		}
	}
	if auth == nil {
		auth = &yaml.Node{Kind: yaml.MappingNode}
		root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "auth"}, auth)
	}
	if !slices.ContainsFunc(auth.Content, func(n *yaml.Node) bool { return n.Value == "tokens_file" }) {
		auth.Content = append(auth.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "tokens_file"}, &yaml.Node{Kind: yaml.ScalarNode, Value: write("tokens.yaml", tokens)})
	}
	b, err := yaml.Marshal(&doc)
	require.NoError(t, err)
	p := filepath.Join(dir, "receiver.yaml")
	require.NoError(t, os.WriteFile(p, b, 0o600))
	cmd := exec.Command(filepath.Join(bin, "receiver"), "--config.file="+p, "--storage.path="+filepath.Join(dir, "data"), "--check-config")
	cmd.Env = append(os.Environ(), "POD_NAME=phonehome-receiver-0") // as the StatefulSet sets it: examples use ${POD_NAME}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "receiver --check-config:\n%s\n%s", out, b)
	require.Contains(t, string(out), "ok")
}
